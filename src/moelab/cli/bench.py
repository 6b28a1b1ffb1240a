"""`moelab bench`: streaming load against a running OpenAI-compatible server, one or more points."""
from __future__ import annotations

import math
from pathlib import Path

import typer

from moelab.cli.app import app


@app.command()
def bench(
    url: str = typer.Option(..., "--url", help="Server base URL, e.g. http://127.0.0.1:8000"),
    model: str = typer.Option(None, "--model", help="Model name (default: the first one /v1/models lists)."),
    concurrency: str = typer.Option(None, "--concurrency", help="Fixed concurrency points, e.g. 1,4,16."),
    request_rate: str = typer.Option(None, "--request-rate", help="Poisson request rates per second, e.g. 2,8,inf."),
    input_len: int = typer.Option(128, "--input-len", help="Synthetic prompt length in tokens."),
    output_len: int = typer.Option(64, "--output-len", help="Output tokens per request (ignore_eos + min_tokens)."),
    dataset: Path = typer.Option(None, "--dataset", help='JSONL prompts: {"prompt": "...", "output_len": 64} per line.'),
    num_prompts: int = typer.Option(64, "--num-prompts", help="Requests per point."),
    slo: str = typer.Option(None, "--slo", help="Goodput SLO, e.g. ttft_ms=500,itl_ms=50 (also tpot_ms, e2e_ms)."),
    reference: Path = typer.Option(None, "--reference", help="Probe reference REF.json: probe prompts mixed into the load are compared with it."),
    weight_format: str = typer.Option("bf16", "--format", help="Weight format (tolerance of the under-load probe)."),
    tokenizer: Path = typer.Option(None, "--tokenizer", help="The model's tokenizer.json, for exact prompt lengths."),
    seed: int = typer.Option(0, "--seed"),
    api_key: str = typer.Option(None, "--api-key", help="Bearer token for servers started with an API key "
                                "(default: $MOELAB_API_KEY, then $OPENAI_API_KEY); never printed."),
    find: str = typer.Option(None, "--find", help="Search the highest load that meets --slo: max-concurrency or "
                             "max-rate (double until the SLO breaks, then bisect; --concurrency/--request-rate "
                             "give the start)."),
    slo_percentile: float = typer.Option(90.0, "--slo-percentile", help="Percentile at which --find holds the SLO."),
    find_limit: float = typer.Option(None, "--find-limit", help="Highest load --find tries (default 1024 "
                                     "concurrent, 1000 req/s)."),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON document (raw samples included)."),
) -> None:
    """Measure TTFT / ITL / TPOT / E2E, tokens/s and goodput, and the server's own /metrics beside them;
    mark a run invalid rather than print a wrong number. With --find, the capacity under the SLO."""
    from moelab.cli.output import emit_json, fail, http_refusal
    from moelab.load import Workload, parse_points, parse_slo, sweep
    from moelab.probe import RequestFailed, ServerUnreachable, tolerance_for
    from moelab.secrets import api_key as resolve_key

    key = resolve_key(api_key)
    if concurrency and request_rate:
        fail("give --concurrency or --request-rate, not both")
    for p, what in ((dataset, "dataset"), (reference, "reference"), (tokenizer, "tokenizer")):
        if p is not None and not p.is_file():
            fail(f"no such {what} file: {p}")
    if find is not None:
        from moelab.load.capacity import MODES

        if find not in MODES:
            fail(f"--find {find!r} is not a search moelab knows", f"use one of: {', '.join(MODES)}")
        if not slo:
            fail("--find needs --slo: the limits the load must meet", "e.g. --slo ttft_ms=500,tpot_ms=50")
        if (find == "max-concurrency" and request_rate) or (find == "max-rate" and concurrency):
            fail(f"--find {find} starts from {'--concurrency' if find == 'max-concurrency' else '--request-rate'}",
                 "give that option (one value: where the search starts), or neither")
        if not 0 < slo_percentile <= 100:
            fail(f"--slo-percentile {slo_percentile:g} is not a percentile", "give 0 < p <= 100, e.g. 90 or 99")
    try:
        tolerance_for(weight_format)
        if find is not None:
            _find(url, find, concurrency or request_rate, slo, slo_percentile, find_limit, model, key, json_out,
                  dict(input_len=input_len, output_len=output_len, dataset=dataset, num_prompts=num_prompts,
                       seed=seed, weight_format=weight_format, tokenizer=tokenizer))
        by = "request_rate" if request_rate else "concurrency"
        points = parse_points(request_rate or concurrency or "1", by.replace("_", "-"))
        first = {"request_rate": points[0]} if request_rate else {"concurrency": int(points[0])}
        w = Workload(**first, input_len=input_len, output_len=output_len, dataset=dataset, num_prompts=num_prompts,
                     slo=parse_slo(slo), seed=seed, weight_format=weight_format, tokenizer=tokenizer)
        results = sweep(url, w, points, by=by, model=model, reference=reference, progress=not json_out, api_key=key)
    except ServerUnreachable as e:
        fail(str(e), "is the server running? check --url (scheme, host and port)")
    except RequestFailed as e:
        fail(*http_refusal(e, key))
    except ValueError as e:
        fail(str(e).splitlines()[-1] if "validation error" in str(e) else str(e))
    ok = all(r.valid and (r.correctness is None or r.correctness.ok) for r in results)
    if json_out:
        emit_json({"ok": ok, "points": results})
    else:
        _print(results)
    raise typer.Exit(0 if ok else 1)


def _find(url: str, mode: str, start_text: str | None, slo_text: str, pct: float, limit: float | None,
          model: str | None, key: str | None, json_out: bool, wl: dict) -> None:
    """`bench --find`: the capacity search, its points and the answer; exit 0 when a load met the SLO."""
    from moelab.cli.output import console, emit_json, err_console
    from moelab.load import Workload, parse_points, parse_slo
    from moelab.load.capacity import MODES, find

    by = MODES[mode]
    starts = parse_points(start_text, by.replace("_", "-")) if start_text else [1.0]
    if len(starts) != 1:
        raise ValueError(f"--find starts from one value, got {start_text!r}")
    slo = parse_slo(slo_text)
    w = Workload(**({"concurrency": int(starts[0])} if by == "concurrency" else {"request_rate": starts[0]}),
                 slo=slo, **wl)

    def said(st, res) -> None:
        if not json_out:
            err_console.print(f"  {res.workload.label}: {'meets the SLO' if st.met else 'breaks it: ' + '; '.join(st.why)}",
                              markup=False)

    cap, results = find(url, w, slo, mode, pct=pct, start=starts[0], limit=limit, model=model, api_key=key,
                        progress=not json_out, on_point=said)
    if json_out:
        emit_json({"ok": cap.answer is not None, "capacity": cap, "points": results})
    else:
        _print(results)
        console.print(capacity_sentence(cap), markup=False)
    raise typer.Exit(0 if cap.answer is not None else 1)


def capacity_sentence(cap) -> str:
    """The answer in words, with the point above it that broke the SLO."""
    what = "concurrency" if cap.mode == "max-concurrency" else "request rate"
    lim = ", ".join(f"{k} <= {v:g}" for k, v in cap.slo.model_dump().items() if v is not None)
    unit = "" if cap.mode == "max-concurrency" else " req/s"
    tried = ", ".join(f"{s.value:g}{'' if s.met else 'x'}" for s in cap.steps)
    if cap.answer is None:
        lowest = min(cap.steps, key=lambda s: s.value) if cap.steps else None
        return (f"no {what} meets {lim} at p{cap.percentile:g}: the lowest tried, {lowest.value:g}{unit}, broke it "
                f"({'; '.join(lowest.why)})" if lowest else "no load point ran")
    out = (f"max {what} meeting {lim} at p{cap.percentile:g}: {cap.answer:g}{unit} (goodput "
           f"{_f(cap.goodput, 2)} req/s, {_f(cap.output_tps, 0)} output tok/s)")
    if cap.broke_next is not None:
        out += f"; {cap.broke_next.value:g}{unit} broke it: {'; '.join(cap.broke_next.why)}"
    if cap.at_limit:
        out += "; that is --find-limit: the server may take more"
    if cap.non_monotone:
        out += (f"; note: {', '.join(f'{v:g}' for v in cap.non_monotone)} met it above the lowest break "
                "(noise): the lowest break bounds the answer")
    return out + f" [points tried, x = broke: {tried}]"


def _f(x: float | None, nd: int = 1) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:,.{nd}f}"


def _ms(x: float | None) -> str:
    """Milliseconds with as many decimals as the magnitude deserves (keeps the table narrow)."""
    if x is None:
        return "-"
    return f"{x:.2f}" if x < 10 else f"{x:.1f}" if x < 100 else f"{x:.0f}"


def _print(results) -> None:
    from rich import box
    from rich.table import Table

    from moelab.cli.output import console

    r0 = results[0]
    t = Table(title=f"bench {r0.base_url}  model={r0.model}  in={r0.workload.input_len} out={r0.workload.output_len}",
              box=box.SIMPLE_HEAD, padding=(0, 1), pad_edge=False)
    for col in ("point", "req/s", "tok/s", "TTFT p50/p99", "ITL p50/p99", "TPOT", "goodput", "err", "status"):
        t.add_column(col, justify="left" if col in ("point", "status") else "right")
    for r in results:
        m = r.metrics
        if not r.valid:
            status = "[red]INVALID"
        elif r.correctness is not None and not r.correctness.ok:
            status = f"[red]{r.correctness.cause.value}"
        else:
            status = "[green]ok" + ("+probe" if r.correctness is not None else "")
        point = r.workload.label.replace("concurrency=", "c=")
        t.add_row(point, _f(m.request_throughput, 1), _f(m.output_throughput, 0),
                  f"{_ms(m.ttft_ms.p50)}/{_ms(m.ttft_ms.p99)}", f"{_ms(m.itl_ms.p50)}/{_ms(m.itl_ms.p99)}",
                  _ms(m.tpot_ms.p50), _f(m.goodput, 2), str(sum(m.errors.values())), status)
    console.print(t)
    console.print(f"times in ms; prompt lengths: {r0.prompt_len_source}"
                  + ("; +probe: probe prompts mixed into the load passed" if r0.correctness is not None else ""))
    _print_server(results)
    for r in results:
        for why in r.invalid_reasons:
            console.print(f"[red]invalid[/] {r.workload.label}: {why}")
        for kind, detail in r.metrics.error_examples.items():
            console.print(f"  first {kind}: {detail[:160]}", markup=False)
        if r.correctness is not None and not r.correctness.ok:
            for e in r.correctness.evidence[:3]:
                console.print(f"[red]under load[/] {r.workload.label}: {e.text}")


def _gauge(g) -> str:
    return "-" if g is None else f"{g.mean:.1f}/{g.peak:.0f}"


def _hist(h, key: str = "p90_ms") -> str:
    if h is None:
        return "-"
    b = getattr(h, key)
    return f"{_ms(h.mean_ms)}/" + ("≤" + _ms(b) if b is not None else "beyond its buckets")


def server_rows(results) -> list[tuple[str, ...]]:
    """The server's own figures per point, as table cells (what `bench` and `bench --find` print)."""
    rows = []
    for r in results:
        w = r.server
        if w is None or not w.available:
            continue
        kv = "-" if w.kv_usage is None else f"{w.kv_usage.mean:.0%}/{w.kv_usage.peak:.0%}"
        rows.append((r.workload.label.replace("concurrency=", "c="), _gauge(w.running), _gauge(w.waiting), kv,
                     "-" if w.preemptions is None else f"{w.preemptions:.0f}", _hist(w.ttft_ms), _hist(w.itl_ms),
                     _hist(w.decode_step_ms, "p50_ms"),
                     "-" if w.generation_tokens is None else f"{w.generation_tokens:,.0f}"))
    return rows


def _print_server(results) -> None:
    from rich import box
    from rich.table import Table

    from moelab.cli.output import console

    rows = server_rows(results)
    missing = [r for r in results if r.server is not None and not r.server.available]
    if not rows:
        if missing:
            console.print(f"server metrics: none ({missing[0].server.note})")
        return
    t = Table(title="the server's own metrics (/metrics, per point)", box=box.SIMPLE_HEAD, padding=(0, 1),
              pad_edge=False)
    for col in ("point", "running", "waiting", "KV cache", "preempted", "TTFT", "ITL", "decode step", "tokens out"):
        t.add_column(col, justify="left" if col == "point" else "right")
    for row in rows:
        t.add_row(*row)
    console.print(t)
    first = next(r.server for r in results if r.server is not None and r.server.available)
    console.print("running, waiting, KV cache: mean/peak over the scrapes under load; TTFT, ITL: mean/p90 ms; "
                  "decode step: mean/p50 ms (a percentile is the edge of the server's histogram bucket it falls in, "
                  "an upper bound); series: "
                  + ", ".join(first.series.values()), markup=False)
    for r in results:
        for f in r.findings:
            console.print(f"[yellow]finding[/] {f}")
