"""`moelab kernels`: every MoE runner backend against the reference and the roofline, per format.

Each (backend, format) runs in its own worker process (moe/bench.py), so a crash, an illegal memory
access or a compile error becomes a verdict cause instead of ending the run. On a GPU a calibration
worker first measures copy bandwidth and bf16 matmul rate; rows show time, % of roofline and the
speedup over the grouped backend. On CPU only reference and grouped run and the roofline is unknown.
"""
from __future__ import annotations

import time

from pathlib import Path
from typing import Any

import typer

from moelab.cli.app import app
from moelab.cli.output import console, emit_json, err_console, fail

DEFAULT_TOKENS = "1,16,64,256,1024,4096"


def _parse_list(text: str, flag: str, allowed: list[str] | None = None) -> list[str]:
    items = [t.strip() for t in text.split(",") if t.strip()]
    if not items:
        fail(f"{flag} is empty", f"give a comma-separated list, e.g. {flag} {','.join(allowed or ['1'])}")
    if allowed is not None:
        bad = [t for t in items if t not in allowed]
        if bad:
            fail(f"{flag} has unknown value(s) {', '.join(bad)}", f"choose from {', '.join(allowed)}")
    return items


def _rows_for(result, backend: str, fmt: str, tokens: list[int]) -> list[dict[str, Any]]:
    """Worker records -> table rows; token counts the worker never reached carry its failure cause."""
    rows = [r for r in result.records if r.get("kind") == "row"]
    unsupported = next((r for r in result.records if r.get("kind") == "unsupported"), None)
    done = {r["tokens"] for r in rows}
    for T in tokens:
        if T in done:
            continue
        if unsupported:
            rows.append({"backend": backend, "format": fmt, "tokens": T, "cause": "unsupported_arch",
                         "evidence": unsupported["reason"]})
        else:
            rows.append({"backend": backend, "format": fmt, "tokens": T, "cause": result.cause.value,
                         "evidence": result.evidence})
    return sorted(rows, key=lambda r: r["tokens"])


@app.command()
def kernels(
    shape: str = typer.Option("qwen3-30b-a3b", "--shape", help="Preset (qwen3-30b-a3b, mixtral-8x7b, deepseek-v3, "
                              "qwen3.5-397b-a17b-tp8) or E,K,H,I."),
    tokens: str = typer.Option(None, "--tokens", help=f"Token counts (default {DEFAULT_TOKENS} on GPU, 1,16,64 on CPU)."),
    backends: str = typer.Option("all", "--backends", help="Comma list of MoE runner backends, or all."),
    formats: str = typer.Option("bf16,fp8,nvfp4", "--formats", help="Weight formats: bf16, fp8, nvfp4."),
    fp8_block: bool = typer.Option(False, "--fp8-block", help="fp8 with 128x128 block scales instead of per-channel."),
    tune: bool = typer.Option(False, "--tune", help="Tune the triton runner's launch configs first (GPU only)."),
    tune_only: bool = typer.Option(False, "--tune-only", help="With --tune: stop after tuning."),
    config_dir: Path = typer.Option(None, "--config-dir", help="Where tuned configs are read/written "
                                    "(default: moelab/moe/configs)."),
    reps: int = typer.Option(50, "--reps", help="Timed repetitions per row (each one replays every rotation)."),
    timeout: float = typer.Option(600.0, "--timeout", help="Seconds per worker process before it counts as a hang."),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON document."),
) -> None:
    """Measure each MoE runner backend for correctness and speed against the roofline."""
    from moelab.moe import FORMATS, RUNNERS
    from moelab.moe.roofline import parse_shape, roofline_us
    from moelab.moe.worker import run_worker, worker_argv

    try:
        label, (E, K, H, I) = parse_shape(shape)
    except ValueError as e:
        fail(str(e))
    fmts = _parse_list(formats, "--formats", list(FORMATS))
    names = RUNNERS.names() if backends == "all" else _parse_list(backends, "--backends", RUNNERS.names())
    env = {"MOELAB_MOE_CONFIG_DIR": str(config_dir)} if config_dir else {}
    say = err_console.print if json_out else console.print

    err_console.print("[dim]kernels: calibrating copy bandwidth and matmul rate ...[/]", highlight=False)
    cal = run_worker(worker_argv({"mode": "calibrate"}), timeout, env)
    calib = next((r for r in cal.records if r.get("kind") == "calibration"), None)
    if calib is None:
        fail(f"the calibration worker failed ({cal.cause.value}): {cal.evidence}",
             "check that torch is installed: pip install 'moelab[engine]'")
    on_gpu = calib.get("device") != "cpu"
    tok_text = tokens or (DEFAULT_TOKENS if on_gpu else "1,16,64")
    try:
        toks = [int(t) for t in _parse_list(tok_text, "--tokens")]
    except ValueError:
        fail(f"--tokens {tok_text!r} must be comma-separated integers", "e.g. --tokens 1,16,64")
    if min(toks) < 1:
        fail("--tokens must be positive")
    if reps < 1:
        fail("--reps must be at least 1")
    notes = []
    if not on_gpu:
        if backends == "all":
            names = [n for n in names if n != "triton"]
        notes.append("no CUDA GPU: reference and grouped only, wall-clock timing, roofline unknown "
                     "(the triton kernel is checked on CPU through TRITON_INTERPRET=1 in the tests)")
        if tune:
            fail("--tune needs a CUDA GPU", "run it on the GPU machine, or drop --tune")
    else:
        notes.append(f"{calib['device']}: copy {calib['copy_bw_bytes_s'] / 1e12:.2f} TB/s, "
                     f"bf16 matmul {calib['bf16_flops_s'] / 1e12:.0f} TFLOP/s (measured now)")
        if "triton" in names and not tune:  # a tuned file from other kernels: say so before timing with it
            from moelab.moe.triton_configs import stale_note, tuned_file

            for fmt in fmts:  # the file the workers will use (they get config_dir as MOELAB_MOE_CONFIG_DIR)
                f = tuned_file(E, I, fmt, calib["device"].replace(" ", "_"), config_dir)
                note = f and stale_note(f)
                if note:
                    notes.append(note)
    for n in notes:
        say(f"[dim]{n}[/]")
    block = [128, 128] if fp8_block else None
    tuned: list[dict] = []
    if tune:
        for fmt in fmts:
            spec = {"mode": "tune", "shape": [E, K, H, I], "format": fmt, "tokens": toks,
                    "config_dir": str(config_dir) if config_dir else None, "block": block if fmt == "fp8" else None}
            err_console.print(f"[dim]kernels: tuning triton {fmt} (minutes per format) ...[/]", highlight=False)
            res = run_worker(worker_argv(spec), timeout, env)
            tuned += res.records
            say(f"tuned triton {fmt}: " + (res.cause.value if res.cause.value != "ok" else
                ", ".join(f"T={r['tokens']} {r['default_us']:.0f}->{r['time_us']:.0f}us ({r['winner']})" for r in res.records
                          if r.get("kind") == "tuned")))
    if tune and tune_only:
        if json_out:
            emit_json({"device": calib.get("device"), "tuned": tuned})
        return
    order = sorted(names, key=lambda n: (n != "grouped", n))  # grouped first: the speedup baseline
    rows: list[dict[str, Any]] = []
    for fmt in fmts:
        for name in order:
            spec = {"mode": "run", "shape": [E, K, H, I], "format": fmt, "backend": name, "tokens": toks,
                    "copy_bw_bytes_s": calib.get("copy_bw_bytes_s"), "bf16_flops_s": calib.get("bf16_flops_s"),
                    "block": block if fmt == "fp8" else None, "reps": min(5, reps) if name == "reference" else reps}
            t0 = time.monotonic()
            err_console.print(f"[dim]kernels: {name} {fmt}, {len(toks)} token counts ...[/]", highlight=False)
            res = run_worker(worker_argv(spec), timeout, env)
            rows += _rows_for(res, name, fmt, toks)
            err_console.print(f"[dim]kernels: {name} {fmt}: {res.cause.value} in {time.monotonic() - t0:.0f} s[/]",
                              highlight=False)
    base = {(r["format"], r["tokens"]): r.get("time_us") for r in rows if r["backend"] == "grouped"}
    for r in rows:
        t, g = r.get("time_us"), base.get((r["format"], r["tokens"]))
        r["pct_roofline"] = 100 * r["roofline_us"] / t if t and r.get("roofline_us") else None
        r["speedup_vs_grouped"] = g / t if t and g and r.get("cause") == "ok" else None
    doc = {"shape": {"name": label, "E": E, "K": K, "H": H, "I": I}, "device": calib.get("device"),
           "copy_bw_bytes_s": calib.get("copy_bw_bytes_s"), "bf16_flops_s": calib.get("bf16_flops_s"),
           "copy_bw_by_method": calib.get("copy_bw_by_method"), "notes": notes, "tuned": tuned, "rows": rows}
    if json_out:
        emit_json(doc)
    else:
        _print_table(doc)
    if any(r["cause"] not in ("ok", "unsupported_arch") for r in rows):
        raise typer.Exit(1)


def _fmt(v, spec: str, none: str = "-") -> str:
    return none if v is None else format(v, spec)


def _print_table(doc: dict) -> None:
    from rich.table import Table

    s = doc["shape"]
    t = Table(title=f"MoE layer {s['name']} (E={s['E']}, top-{s['K']}, H={s['H']}, I={s['I']}) on {doc['device']}")
    for col in ("backend", "format", "tokens", "time µs", "roofline µs", "% roofline", "vs grouped",
                "rel err", "mem MiB", "launch", "verdict"):
        t.add_column(col, justify="left" if col in ("backend", "format", "launch", "verdict") else "right")
    for r in doc["rows"]:
        verdict = r["cause"] if r["cause"] == "ok" else f"[red]{r['cause']}[/] {r.get('evidence', '')[:60]}"
        t.add_row(r["backend"], r["format"], str(r["tokens"]), _fmt(r.get("time_us"), ".1f"),
                  _fmt(r.get("roofline_us"), ".1f", "unknown"), _fmt(r.get("pct_roofline"), ".0f"),
                  _fmt(r.get("speedup_vs_grouped"), ".2f"), _fmt(r.get("rel_err"), ".1e"),
                  _fmt(r.get("mem_mib"), ".1f"), r.get("launch") or "", verdict)
    from rich.console import Console

    # a pipe gets rich's 80 columns by default; this table needs more to stay readable
    Console(highlight=False, width=max(console.width, 150)).print(t)
