"""`moelab probe`: the correctness gate against a running OpenAI-compatible server."""
from __future__ import annotations

from pathlib import Path

import typer

from moelab.cli.app import app


@app.command()
def probe(
    url: str = typer.Option(..., "--url", help="Server base URL, e.g. http://127.0.0.1:8000"),
    model: str = typer.Option(None, "--model", help="Model name (default: the first one /v1/models lists)."),
    record: Path = typer.Option(None, "--record", "--save", help="Keep this server's answers as the reference REF.json."),
    against: Path = typer.Option(None, "--against", help="Compare with a recorded reference REF.json."),
    weight_format: str = typer.Option("bf16", "--format", help="Weight format of the server: bf16, fp8 or nvfp4 (sets tolerances)."),
    chat: bool = typer.Option(False, "--chat", help="Use /v1/chat/completions (chat templates differ between configurations)."),
    timeout: float = typer.Option(60.0, "--timeout", help="Seconds per request."),
    api_key: str = typer.Option(None, "--api-key", help="Bearer token for servers started with an API key "
                                "(default: $MOELAB_API_KEY, then $OPENAI_API_KEY); never printed."),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON document."),
) -> None:
    """Greedy probe prompts; NaN / empty / degenerate checks, and a comparison with a reference."""
    from moelab.cli.output import emit_json, err_console, fail, http_refusal
    from moelab.probe import RequestFailed, ServerUnreachable, record_reference, run_probe, tolerance_for
    from moelab.secrets import api_key as resolve_key

    key = resolve_key(api_key)
    if record and against:
        fail("--record and --against exclude each other", "record a reference first, then compare against it")
    try:
        tolerance_for(weight_format)
    except ValueError as e:
        fail(str(e))
    if against is not None and not against.is_file():
        fail(f"no such reference file: {against}", f"record one with `moelab probe --url URL --record {against}`")
    try:
        with err_console.status(f"probing {url} ...", spinner="dots") if not json_out else _null():
            if record:
                rep = record_reference(url, model, record, timeout, weight_format=weight_format, chat=chat,
                                       api_key=key)
            else:
                rep = run_probe(url, model, against, timeout, weight_format=weight_format, chat=chat, api_key=key)
    except ServerUnreachable as e:
        fail(str(e), "is the server running? check --url (scheme, host and port)")
    except RequestFailed as e:
        fail(*http_refusal(e, key))
    except ValueError as e:
        fail(str(e))
    if json_out:
        emit_json(rep)
    else:
        _print(rep)
    raise typer.Exit(0 if rep.verdict.ok else 1)


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def _print(rep) -> None:
    from rich.table import Table

    from moelab.cli.output import console

    t = Table(title=f"probe {rep.base_url}  model={rep.model}  format={rep.weight_format}")
    for col in ("prompt", "answer", "tokens", "checks", "vs reference"):
        t.add_column(col, overflow="fold")
    for r in rep.prompts:
        if r.error:
            t.add_row(r.id, f"[red]{r.error[:60]}", "", "", "")
            continue
        c = r.comparison
        cmp = "" if c is None else (f"[green]{c.reason}" if c.passed else f"[red]{c.reason}")
        if c is not None and c.mean_drift is not None:
            cmp += f" (agree {c.agreement:.0%}, drift {c.mean_drift:.3f})"
        t.add_row(r.id, repr(r.answer.text[:40]), str(len(r.answer.tokens)),
                  ", ".join(r.symptoms.names) or "[green]ok", cmp)
    console.print(t)
    v = rep.verdict
    style = "green" if v.ok else "red"
    console.print(f"verdict: [bold {style}]{v.cause.value}[/] (phase {v.phase.value}) — {rep.note}")
    for e in v.evidence[:6]:
        if not v.ok or "warning" in e.text:
            console.print(f"  - {e.text}")
    if v.advice:
        console.print(f"advice: {v.advice}")
