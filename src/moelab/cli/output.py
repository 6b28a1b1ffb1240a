"""Two channels: a readable table for people, one JSON document for programs (`--json`)."""
from __future__ import annotations

import json
import sys
from typing import Any

from pydantic import BaseModel
from rich.console import Console

console = Console(stderr=False, highlight=False)
err_console = Console(stderr=True, highlight=False)


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


def fail(message: str, hint: str | None = None, code: int = 2, json_out: bool = False) -> "NoReturn":  # noqa: F821
    """Say what was wrong and what to do, then exit non-zero (with --json: as one JSON object)."""
    import typer

    if json_out:
        emit_json({"error": message, "hint": hint})
        raise typer.Exit(code)
    err_console.print(f"[bold red]error:[/] {message}")
    if hint:
        err_console.print(f"[dim]hint:[/] {hint}")
    raise typer.Exit(code)
