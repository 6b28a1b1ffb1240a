"""The Typer application every command module registers itself on."""
from __future__ import annotations

import typer

app = typer.Typer(
    name="moelab",
    help="Find the fastest MoE serving configuration that actually works, and say why the others do not.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def _root() -> None:
    """Find the fastest MoE serving configuration that actually works, and say why the others do not."""


@app.command()
def version(json_out: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """Print moelab's version."""
    from moelab import __version__

    if json_out:
        from moelab.cli.output import emit_json

        emit_json({"moelab": __version__})
    else:
        typer.echo(f"moelab {__version__}")
