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
    json_out: bool = typer.Option(False, "--json", help="Print one JSON document (raw samples included)."),
) -> None:
    """Measure TTFT / ITL / TPOT / E2E, tokens/s and goodput; mark a run invalid rather than print a wrong number."""
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
    try:
        tolerance_for(weight_format)
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
    for r in results:
        for why in r.invalid_reasons:
            console.print(f"[red]invalid[/] {r.workload.label}: {why}")
        for kind, detail in r.metrics.error_examples.items():
            console.print(f"  first {kind}: {detail[:160]}", markup=False)
        if r.correctness is not None and not r.correctness.ok:
            for e in r.correctness.evidence[:3]:
                console.print(f"[red]under load[/] {r.workload.label}: {e.text}")
