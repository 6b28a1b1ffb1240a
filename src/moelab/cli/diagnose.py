"""`moelab diagnose LOGFILE`: classify a server log captured elsewhere with the launch rules."""
from __future__ import annotations

from pathlib import Path

import typer

from moelab.cli.app import app


@app.command()
def diagnose(
    logfile: Path = typer.Argument(..., help="Server log, e.g. from `nohup ... > server.log 2>&1`."),
    exit_code: int | None = typer.Option(None, "--exit-code", help="The server's exit status (137 = SIGKILL, "
                                         "-9 also accepted), if you know it."),
    engine: str | None = typer.Option(None, "--engine", help="Engine whose own rules apply too "
                                      "(sglang, vllm, embedded ...); generic rules always apply."),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object (cause, phase, evidence, advice)."),
) -> None:
    """Say why a server died from its log: cause, phase, evidence lines with numbers, advice."""
    from moelab.cli.output import console, fail
    from moelab.diagnose import RuleError, classify, rule_engines
    from moelab.diagnose.render import verdict_json, verdict_panel

    if not logfile.is_file():
        fail(f"no such log file: {logfile}", "give the path of a server log, e.g. server.log")
    from moelab.engines import ENGINES

    known = sorted({*rule_engines(), *ENGINES.names(), "sglang", "vllm"})
    if engine is not None and engine not in known:
        fail(f"no rules for engine {engine!r}", f"use one of: {', '.join(known)} (or leave --engine out)")
    lines = logfile.read_text(encoding="utf-8", errors="replace").splitlines()
    try:
        v = classify(lines, exit_code=exit_code, engine=engine)
    except RuleError as e:
        fail(f"a rule file is broken: {e}", "fix the rule named above")
    if json_out:
        typer.echo(verdict_json(v, log=str(logfile), lines=len(lines)))
    else:
        console.print(verdict_panel(v, log_name=logfile.name, footer=[f"{len(lines)} lines read from {logfile}"]))
    raise typer.Exit(0 if v.ok else 1)
