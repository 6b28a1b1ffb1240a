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
    kernels,
    launch,
    probe,
    report,
    serve,
    store,
    study,
)


def main() -> None:
    app()
