"""`moelab demo`: a real staged study of the embedded engine on this machine, report included.

The trained `digits` preset; MoE runner backends (reference, grouped, triton) x weight formats
(none, fp8, nvfp4), each gated on task accuracy against the reference configuration, then
--max-running-requests tuned on the survivors. On a CPU-only machine `triton` is refused by the
engine itself (a real failure), and the other triton combinations are pruned before launch because
that failure's evidence names the flag. Ends with the Markdown summary and the HTML report's path.
"""
from __future__ import annotations

from pathlib import Path

import typer

from moelab.cli.app import app

DEMO = Path(__file__).resolve().parent.parent / "study" / "demo.yaml"


@app.command()
def demo(
    out: Path = typer.Option(Path("moelab-demo"), "--out", help="Folder for the store, trial logs and reports."),
    json_out: bool = typer.Option(False, "--json", help="Print the study summary as one JSON document."),
) -> None:
    """Run a small staged study of the embedded engine here and write its report (about two minutes on a 2-core CPU)."""
    from moelab.cli.output import console, emit_json, err_console, fail
    from moelab.cli.study import run_study_file
    from moelab.report import markdown, write_reports
    from moelab.store import StoreError
    from moelab.study import load_study

    try:
        import torch  # noqa: F401  (the embedded engine needs it; say so before anything starts)
    except ImportError:
        fail("the demo runs the embedded engine, which needs torch",
             'install it: pip install torch -e ".[engine]" (CPU builds work)')
    out.mkdir(parents=True, exist_ok=True)
    store = out / "demo.db"
    err_console.print(f"[bold]moelab demo[/]: staged study of the embedded engine (the trained digits preset) on "
                      f"this machine; "
                      f"store {store}")
    try:
        # Fresh measurements every run (no reuse of an earlier demo's verdicts); an interrupted demo
        # still resumes where it stopped.
        summary = run_study_file(load_study(DEMO), store, rerun=True, json_out=json_out, out_dir=out / "trials")
    except KeyboardInterrupt:
        err_console.print(f"[yellow]interrupted:[/] run `moelab demo --out {out}` again to resume")
        raise typer.Exit(130)
    except StoreError as e:
        fail(str(e), "another `moelab demo` is writing that folder; give this one another --out")
    html, md = out / "report.html", out / "report.md"
    data = write_reports(store, html=html, md=md, study_id=summary["study_id"])
    summary.update(report_html=str(html.resolve()), report_md=str(md.resolve()))
    if json_out:
        emit_json(summary)
    else:
        text = markdown.render(data)
        console.print(text.split("\n## Trials")[0], markup=False, highlight=False, soft_wrap=True)
        console.print(f"HTML report: {html.resolve()}\nMarkdown report: {md.resolve()}")
    raise typer.Exit(0 if summary.get("recommendation") else 1)
