"""`moelab diagnose LOG...`: why a server died, from logs captured elsewhere.

One log, several, a folder of them (every file, recursively; one verdict each and a summary
table), or standard input (`-`). The engine is guessed from each log's own words unless
`--engine` says it. Exit 0 when every log is `ok`, 1 when one names a failure, 2 for bad usage.
"""
from __future__ import annotations

import sys
from pathlib import Path

import typer

from moelab.cli.app import app

MAX_FILES = 2000


def _logs(paths: list[str]) -> list[tuple[str, list[str]]]:
    """(name, lines) of every log the arguments name; raises ValueError saying what was wrong."""
    out: list[tuple[str, list[str]]] = []
    for p in paths:
        if p == "-":
            out.append(("<stdin>", sys.stdin.read().splitlines()))
            continue
        path = Path(p)
        if path.is_dir():
            files = sorted(f for f in path.rglob("*") if f.is_file() and not f.name.startswith("."))
            if not files:
                raise ValueError(f"{path} is a folder with no files in it: give a log file, a folder of logs, or -")
            if len(files) > MAX_FILES:
                raise ValueError(f"{path} holds {len(files)} files; give at most {MAX_FILES} (a folder of logs)")
            out += [(str(f), _read(f)) for f in files if not _binary(f)]
        elif path.is_file():
            out.append((str(path), _read(path)))
        else:
            raise ValueError(f"no such log file: {path}")
    return out


def _binary(path: Path) -> bool:
    with path.open("rb") as f:
        return b"\0" in f.read(4096)


def _read(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8", errors="replace").splitlines()


@app.command(options_metavar="[OPTIONS] LOG... (a file, a folder of logs, or - for stdin)")
def diagnose(
    logs: list[str] = typer.Argument(..., help="Server logs (`nohup ... > server.log 2>&1`), folders of logs, or -."),
    exit_code: int | None = typer.Option(None, "--exit-code", help="The server's exit status (137 = SIGKILL, "
                                         "-9 also accepted), if you know it (applies to every log given)."),
    engine: str | None = typer.Option(None, "--engine", help="Engine whose own rules apply too (sglang, vllm, "
                                      "embedded ...); default: guessed from each log."),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON document (one verdict, or every verdict "
                                  "and a summary)."),
) -> None:
    """Say why a server died from its log: cause, phase, evidence lines, advice, and second readings."""
    from moelab.cli.output import console, emit_json, fail
    from moelab.diagnose import RuleError, classify, guess_engine, rule_engines
    from moelab.diagnose.render import verdict_doc, verdict_json, verdict_panel
    from moelab.engines import ENGINES

    known = sorted({*rule_engines(), *ENGINES.names()})
    if engine is not None and engine not in known:
        fail(f"no rules for engine {engine!r}", f"use one of: {', '.join(known)} (or leave --engine out to guess)")
    try:
        found = _logs(logs)
    except ValueError as e:
        fail(str(e), "give the path of a server log (e.g. server.log), a folder of logs, or - for stdin")
    if not found:
        fail("no text logs among the files given", "give a server log file, a folder of logs, or - for stdin")
    results = []
    for name, lines in found:
        if not any(ln.strip() for ln in lines):
            if len(found) == 1:
                fail(f"{name} is empty: there is nothing to diagnose",
                     "give the log of the failed launch (stdout and stderr: `... > server.log 2>&1`)")
            results.append((name, lines, None, None))
            continue
        eng = engine or guess_engine(lines)
        try:
            v = classify(lines, exit_code=exit_code, engine=eng)
        except RuleError as e:
            fail(f"a rule file is broken: {e}", "fix the rule named above")
        results.append((name, lines, eng, v))
    if len(results) == 1:
        name, lines, eng, v = results[0]
        extra = {"log": name, "lines": len(lines), "engine": eng, "engine_guessed": engine is None}
        if json_out:
            typer.echo(verdict_json(v, **extra))
        else:
            guessed = f" (engine {eng}, guessed from the log)" if engine is None and eng else \
                f" (engine {eng})" if eng else ""
            console.print(verdict_panel(v, log_name=Path(name).name,
                                        footer=[f"{len(lines)} lines read from {name}{guessed}"]), soft_wrap=False)
        raise typer.Exit(0 if v.ok else 1)
    judged = [r for r in results if r[3] is not None]
    counts: dict[str, int] = {}
    for _, _, _, v in judged:
        counts[v.cause.value] = counts.get(v.cause.value, 0) + 1
    if json_out:
        emit_json({"logs": [{"log": n, "lines": len(ls), "engine": e, **(verdict_doc(v) if v else
                                                                           {"cause": None, "note": "empty"})}
                            for n, ls, e, v in results],
                   "summary": {"logs": len(results), "empty": len(results) - len(judged), "causes": counts}})
    else:
        _table(results, counts)
    raise typer.Exit(0 if all(v.ok for *_, v in judged) else 1)


def _table(results, counts: dict[str, int]) -> None:
    from rich import box
    from rich.table import Table

    from moelab.cli.output import console

    t = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    for col in ("log", "engine", "cause", "conf.", "second reading", "evidence"):
        t.add_column(col, overflow="fold")
    for name, _, eng, v in results:
        if v is None:
            t.add_row(name, "-", "(empty)", "", "", "")
            continue
        ev = next((e for e in v.evidence if e.kind == "log"), v.evidence[0] if v.evidence else None)
        where = f"{Path(name).name}:{ev.line} " if ev is not None and ev.line else ""
        alt = ", ".join(f"{a.cause.value} {a.confidence:.2f}" for a in v.alternatives[:2])
        t.add_row(name, eng or "-", v.cause.value, f"{v.confidence:.2f}" if v.confidence is not None else "-", alt,
                  (where + (ev.text if ev else ""))[:140])
    console.print(t)
    console.print(f"{len(results)} logs: " + ", ".join(f"{c} {n}" for c, n in sorted(counts.items(), key=lambda x: -x[1])),
                  soft_wrap=True)
