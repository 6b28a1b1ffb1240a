"""`moelab audit [--engine sglang|vllm] [--python PATH] [--json]`.

Reads the installed engine's Python source and the libraries it dispatches to (never importing
them) and prints, for every choice of its backend flags, which GPU architectures the source
allows or refuses, with the file:line that decides, and where that contradicts the bundled
support matrix. The result is cached per engine version for `moelab check`; an audit of source
that has not changed since (no .py file of its packages, nor moelab's audit code) is that cached
one, said so (`--fresh` reads again).
"""
from __future__ import annotations

import typer

from moelab.cli.app import app


@app.command()
def audit(
    engine: str = typer.Option(None, "--engine", help="sglang or vllm (default: the first one installed)."),
    python: str = typer.Option(None, "--python", help="Read the source installed for this interpreter, "
                                                      "e.g. /tmp/moelab-vllm-venv/bin/python."),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON document."),
    fresh: bool = typer.Option(False, "--fresh", help="Read the source again even where nothing of it has "
                                                       "changed since the cached audit."),
) -> None:
    """Which GPU archs the installed engine's own source lets each backend run on, and why."""
    from moelab.audit.render import lines
    from moelab.audit.run import AuditError, run_audit
    from moelab.cli.output import console, emit_json, fail

    hint = ("give --python PATH of an environment with the engine (scripts/install-engine-sources.sh "
            "installs SGLang's and FlashInfer's source into /tmp/moelab-engine-src), or --engine")
    try:
        engine = engine or _installed(python)
        result = run_audit(engine, python, fresh=fresh)
    except AuditError as e:
        fail(str(e), hint, json_out=json_out)
    if json_out:
        emit_json(result)
        return
    for line in lines(result):
        console.print(line, soft_wrap=True, markup=False, highlight=False)


def _installed(python: str | None) -> str:
    """The first engine with a source profile whose package the interpreter has."""
    from moelab.audit.profile import load
    from moelab.audit.run import AuditError
    from moelab.audit.source import locate
    from moelab.engines import ENGINES

    for name in ENGINES.names():
        adapter = ENGINES.create(name)
        profile, py = adapter.source_profile(), python or adapter.engine_python()
        if profile is None or py is None:
            continue
        try:
            if load(profile).packages[0] in locate(py, load(profile).packages):
                return name
        except RuntimeError as e:
            raise AuditError(str(e)) from None
    where = python or "this machine"
    raise AuditError(f"no engine with source to audit (sglang, vllm) is installed for {where}")
