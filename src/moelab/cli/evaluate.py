"""`moelab eval`: exact-match accuracy of a live server on a task, and the paired gate against a reference."""
from __future__ import annotations

from pathlib import Path

import typer

from moelab.cli.app import app


def _concurrency(text: str) -> list[int]:
    try:
        points = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--concurrency {text!r} must be comma-separated integers, e.g. 1,8,32") from None
    if not points or min(points) < 1:
        raise ValueError(f"--concurrency {text!r} must be positive integers, e.g. 1,8,32")
    return points


@app.command("eval")
def eval_(
    url: str = typer.Option(..., "--url", help="Server base URL, e.g. http://127.0.0.1:30000"),
    task: str = typer.Option(..., "--task", help="A bundled task (digits, digits-add, digits-sort, digits-rev), a "
                             "JSONL file of {\"prompt\", \"answer\"} lines, or lm-eval:NAME / lm-eval:FILE.yaml."),
    n: int = typer.Option(None, "--n", help="Use the first N items (default: all)."),
    concurrency: str = typer.Option("1", "--concurrency", help="Requests in flight; several points, e.g. 1,16,64."),
    against: Path = typer.Option(None, "--against", help="Reference answers (a file from --save) to pair with."),
    save: Path = typer.Option(None, "--save", help="Write this server's answers (first concurrency) for a later --against."),
    model: str = typer.Option(None, "--model", help="Model name (default: the first one /v1/models lists)."),
    chat: bool = typer.Option(False, "--chat", help="Use /v1/chat/completions (the prompt as one user message)."),
    confidence: float = typer.Option(0.95, "--confidence", help="One-sided confidence of the paired rule."),
    min_delta: float = typer.Option(0.0, "--min-delta", help="Loss always tolerated, as a fraction (0.01 = 1 point): delta is the larger of this and the noise band."),
    timeout: float = typer.Option(60.0, "--timeout", help="Seconds per request."),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON document (every item's answer included)."),
) -> None:
    """Greedy exact-match accuracy; with --against (or several concurrencies) a paired pass/fail decision."""
    from moelab.cli.output import emit_json, err_console, fail
    from moelab.evaluate import LmEvalError, TaskError, evaluate, load_answers, save_answers
    from moelab.probe import RequestFailed, ServerUnreachable

    def bad(msg: str, hint: str | None = None) -> None:
        fail(msg, hint, json_out=json_out)

    try:
        points = _concurrency(concurrency)
        ref = load_answers(against) if against is not None else None
    except ValueError as e:
        return bad(str(e), f"record one with `moelab eval --url REF_URL --task {task} --save {against}`"
                   if against is not None and not against.is_file() else None)
    try:
        with err_console.status(f"eval {task} on {url} ...", spinner="dots") if not json_out else _null():
            rep = evaluate(url, task, model=model, n=n, concurrency=points, reference=ref,
                           reference_label=f"reference {against}", confidence=confidence, min_delta=min_delta,
                           chat=chat, timeout_s=timeout)
    except ServerUnreachable as e:
        return bad(str(e), "is the server running? check --url (scheme, host and port)")
    except (TaskError, LmEvalError, RequestFailed, ValueError) as e:
        return bad(str(e))
    if save is not None:
        save_answers(rep.points[0].run, save)
    if json_out:
        emit_json(rep)
    else:
        _print(rep, save)
    raise typer.Exit(0 if rep.passed else 1)


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def _print(rep, saved: Path | None) -> None:
    from moelab.cli.output import console

    def say(text: str, markup: bool = True) -> None:  # one line each, never wrapped: easy to grep
        console.print(text, markup=markup, soft_wrap=True)

    r0 = rep.points[0].run
    say(f"eval {rep.task} ({r0.n} items, {rep.source}) on {rep.url} model={rep.model}, "
        f"{r0.endpoint}, greedy, {r0.harness}", markup=False)
    labels = sorted({p.compared_with for p in rep.points if p.compared_with})
    if labels:
        say(f"paired with: {', '.join(labels)}", markup=False)
    say(f"{'point':<6} {'accuracy':<16} {'errors':>6} {'wall':>7} {'lost':>5} {'gained':>6} {'diff':>7} "
        f"{'allowed':>8}  decision", markup=False)
    for p in rep.points:
        r, d = p.run, p.decision
        cells = ["-", "-", "-", "-", "-"] if d is None else [
            str(d.lost), str(d.gained), f"{d.difference:+.2%}", f"-{d.delta:.2%}",
            "[green]pass[/]" if d.passed else "[red]FAIL[/]"]
        err = f"[red]{r.errors:>6}[/]" if r.errors else f"{0:>6}"
        say(f"{'c=' + str(r.concurrency):<6} {f'{r.accuracy:.1%} {r.correct}/{r.n}':<16} {err} {r.wall_s:>6.1f}s "
            f"{cells[0]:>5} {cells[1]:>6} {cells[2]:>7} {cells[3]:>8}  {cells[4]}")
    decided = [p.decision for p in rep.points if p.decision is not None]
    if decided:
        say(f"rule: pass iff paired difference >= -delta, delta = max(min_delta, (z*sqrt(lost+gained)+1)/n), "
            f"z at {rep.confidence:.0%} one-sided (McNemar, continuity-corrected); min_delta {rep.min_delta:.2%}",
            markup=False)
        for p in rep.points:
            if p.decision is not None:
                say(f"  c={p.run.concurrency}: {p.decision.rule}", markup=False)
    for p in rep.points:
        wrong = [x for x in p.run.items if not x.correct]
        for x in wrong[:3]:
            got = f"error: {x.error[:100]}" if x.error else repr(x.completion[:40])
            say(f"  wrong at c={p.run.concurrency}: {x.id} {x.prompt[:40]!r} -> {got} (expected {x.expected!r})",
                markup=False)
        if len(wrong) > 3:
            say(f"  ... and {len(wrong) - 3} more wrong at c={p.run.concurrency}")
    why = [f"c={p.run.concurrency} below the reference" for p in rep.points if p.decision and not p.decision.passed]
    why += [f"{p.run.errors} request(s) failed at c={p.run.concurrency}" for p in rep.points if p.run.errors]
    if decided or why:
        say("verdict: [green]pass[/]" if rep.passed else f"verdict: [red]FAIL[/] ({'; '.join(why)})")
    if saved is not None:
        say(f"answers saved to {saved} (concurrency {r0.concurrency}); compare later with --against {saved}",
            markup=False)
