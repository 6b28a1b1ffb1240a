"""moelab's command line: one module per command, each registering itself on `app`.

Command modules import their heavy dependencies (torch, the engine) inside the command function,
so `moelab --help`, `moelab diagnose` and friends start fast and work without torch.
"""
from __future__ import annotations

from moelab.cli.app import app
from moelab.cli import (  # noqa: F401  (imported for their @app.command registrations)
    audit,
    bench,
    check,
    demo,
    diagnose,
    doctor,
    evaluate,
    kernels,
    launch,
    probe,
    report,
    serve,
    store,
    study,
)


def _click_classes(name: str) -> tuple[type, ...]:
    """`name` from click and from the click that typer vendors (typer >= 0.20 carries its own)."""
    import importlib

    out = []
    for mod in ("typer.exceptions", "typer._click.exceptions", "click.exceptions"):
        try:
            cls = getattr(importlib.import_module(mod), name, None)
        except ImportError:
            continue
        if isinstance(cls, type) and cls not in out:
            out.append(cls)
    return tuple(out)


def main() -> None:
    """Run the CLI. No traceback reaches a user: usage errors say what was wrong (as JSON with
    --json), an interrupt exits 130, and an internal error says so in one line (MOELAB_DEBUG=1
    shows the traceback)."""
    import os
    import sys

    from moelab.cli.output import say_error

    exits, usage, aborts = _click_classes("Exit"), _click_classes("ClickException"), _click_classes("Abort")
    try:
        code = app(standalone_mode=False, prog_name="moelab")
    except exits as e:
        code = e.exit_code
    except usage as e:  # bad usage: unknown option, missing argument, a value of the wrong type
        ctx = getattr(e, "ctx", None)
        prog = ctx.command_path if ctx is not None else "moelab"
        say_error(e.format_message(), f"see `{prog} --help`", e.exit_code, prog=prog)
        code = e.exit_code
    except (*aborts, KeyboardInterrupt):
        code = 130
    except Exception as e:  # a bug of moelab's: one clear line, never a traceback
        if os.environ.get("MOELAB_DEBUG"):
            raise
        say_error(f"moelab failed unexpectedly: {type(e).__name__}: {e}",
                  "rerun with MOELAB_DEBUG=1 to see where, and report it", 3)
        code = 3
    sys.exit(code if isinstance(code, int) else 0)
