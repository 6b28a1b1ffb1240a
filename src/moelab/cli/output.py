"""Two channels: a readable table for people, one JSON document for programs (`--json`)."""
from __future__ import annotations

import json
import sys
from typing import Any

from pydantic import BaseModel
from rich.console import Console

def _console(stderr: bool) -> Console:
    """A terminal wraps to its width; a file or pipe gets whole lines (no hard wrap at 80 columns)
    and tables up to 200 columns wide."""
    stream = sys.stderr if stderr else sys.stdout
    tty = stream.isatty()
    return Console(stderr=stderr, highlight=False, soft_wrap=not tty, width=None if tty else 200)


console = _console(False)
err_console = _console(True)


def to_jsonable(obj: Any) -> Any:
    if isinstance(obj, BaseModel):
        return obj.model_dump(mode="json")
    if isinstance(obj, dict):
        return {k: to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    if hasattr(obj, "__dataclass_fields__"):
        import dataclasses

        return to_jsonable(dataclasses.asdict(obj))
    return obj


def emit_json(obj: Any) -> None:
    """Print exactly one JSON document on stdout."""
    sys.stdout.write(json.dumps(to_jsonable(obj), indent=2, default=str) + "\n")
    sys.stdout.flush()


def json_mode() -> bool:
    """Was --json asked for? Then even a usage error is one JSON document on stdout."""
    return "--json" in sys.argv[1:]


def error_doc(message: str, hint: str | None, code: int) -> dict:
    return {"error": message, "hint": hint, "exit_code": code}


def say_error(message: str, hint: str | None = None, code: int = 2, prog: str | None = None) -> None:
    """Say what was wrong and what to do: on stderr, and with --json also as JSON on stdout.
    `prog` (a usage error) gives argparse's one-line form, `moelab serve: error: ...`."""
    from rich.markup import escape

    if prog:
        err_console.print(f"{escape(prog)}: error: {escape(message)}", soft_wrap=True, highlight=False)
    else:
        err_console.print(f"[bold red]error:[/] {escape(message)}", soft_wrap=True)
    if hint:
        err_console.print(f"[dim]hint:[/] {escape(hint)}", soft_wrap=True)
    if json_mode():
        emit_json(error_doc(message, hint, code))


def fail(message: str, hint: str | None = None, code: int = 2, json_out: bool = False) -> "NoReturn":  # noqa: F821
    """Say what was wrong and what to do, then exit non-zero; with --json (or json_out) also as one
    JSON document on stdout ({"error", "hint", "exit_code"}), so a program reading it still parses it."""
    import typer

    say_error(message, hint, code)
    if json_out and not json_mode():
        emit_json(error_doc(message, hint, code))
    raise typer.Exit(code)


def http_refusal(e, key: str | None) -> tuple[str, str]:
    """(message, hint) for a server that answered every request with an HTTP error."""
    status = getattr(e, "status", None)
    if status in (401, 403) and key:
        return str(e), "the server refused the API key given (--api-key / MOELAB_API_KEY): is it the server's?"
    if status in (401, 403):
        return str(e), "the server wants an API key: pass --api-key KEY or set MOELAB_API_KEY"
    if status == 404:
        return str(e), "no OpenAI-compatible API at that URL: give the server's base URL (http://HOST:PORT)"
    return str(e), "the server answered, but not with a usable completion; see its log"
