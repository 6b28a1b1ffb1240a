"""Reports of a study store: Markdown for terminals and reviews, one self-contained HTML file.

`report_data(store_path)` derives everything from the stored trials; `write_reports` writes the
files and returns that data (what `moelab report --json` prints).
"""
from __future__ import annotations

from pathlib import Path

from moelab.report import html as html_report
from moelab.report import markdown as md_report
from moelab.report.build import build


def report_data(store_path: Path, study_id: int | None = None) -> dict:
    from moelab.store import Store

    if not Path(store_path).exists():
        raise FileNotFoundError(f"no store at {store_path}: run `moelab study FILE --store {store_path}` first")
    with Store(store_path) as st:
        return build(st, study_id)


def write_reports(store_path: Path, *, html: Path | None = None, md: Path | None = None,
                  study_id: int | None = None) -> dict:
    """Write the HTML and/or Markdown report of the store's latest (or given) study; return its data."""
    data = report_data(store_path, study_id)
    for path, mod in ((html, html_report), (md, md_report)):
        if path:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            Path(path).write_text(mod.render(data))
    return data


__all__ = ["build", "report_data", "write_reports"]
