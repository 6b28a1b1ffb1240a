"""`moelab report STORE`: the recommendation, verdict matrix, plots and every trial's evidence."""
from __future__ import annotations

from pathlib import Path

import typer

from moelab.cli.app import app


@app.command()
def report(
    store: Path = typer.Argument(..., help="SQLite store written by `moelab study`."),
    html: Path = typer.Option(None, "--html", help="Write the self-contained HTML report here."),
    md: Path = typer.Option(None, "--md", help="Write the Markdown report here."),
    study_id: int = typer.Option(None, "--study", help="Which study in the store (default: the latest)."),
    json_out: bool = typer.Option(False, "--json", help="Print the report's data as one JSON document."),
) -> None:
    """Report a study: recommended launch command first, then verdicts, curves and evidence."""
    from moelab.cli.output import console, emit_json, fail
    from moelab.report import markdown, write_reports
    from moelab.store import StoreError

    try:
        data = write_reports(store, html=html, md=md, study_id=study_id)
    except (FileNotFoundError, ValueError, StoreError) as e:
        fail(str(e))
    if json_out:
        keep = ("recommendation", "ranked", "matrix", "pareto", "causes", "slo", "objective")
        emit_json({"study": {k: data["study"][k] for k in ("id", "name", "status", "fingerprint")},
                   **{k: data[k] for k in keep}, "html": str(html) if html else None, "md": str(md) if md else None,
                   "trials": [{k: t[k] for k in ("id", "stage", "rep", "label", "status", "cause", "phase", "flags",
                                                 "verdict", "metrics", "paths", "command", "effective")} for t in data["trials"]]})
        return
    if not html and not md:
        console.print(markdown.render(data), markup=False, highlight=False, soft_wrap=True)
        return
    for what, p in (("HTML", html), ("Markdown", md)):
        if p:
            console.print(f"{what} report: {p}")
