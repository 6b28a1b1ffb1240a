"""`moelab store export|import|list`: move verdicts between machines and teams as JSON."""
from __future__ import annotations

import json
from pathlib import Path

import typer

from moelab.cli.app import app

store_app = typer.Typer(help="Export, import and list the studies in a results store.", no_args_is_help=True)
app.add_typer(store_app, name="store")


@store_app.command("export")
def export(
    store: Path = typer.Argument(..., help="SQLite store."),
    out: Path = typer.Option(None, "--out", "-o", help="Write the JSON here (default: stdout)."),
    study_id: int = typer.Option(None, "--study", help="Only this study."),
    json_out: bool = typer.Option(False, "--json", help="With --out: print a JSON summary of what was written."),
) -> None:
    """Write every study and trial (verdicts, evidence, samples, fingerprints) as one JSON document."""
    from moelab.cli.output import console, emit_json, fail
    from moelab.store import Store, StoreError

    if not store.exists():
        fail(f"no store at {store}", "give the path `moelab study --store` wrote")
    try:
        with Store(store) as st:
            doc = st.export(study_id)
    except StoreError as e:
        fail(str(e))
    if out is None:
        emit_json(doc)
        return
    out.write_text(json.dumps(doc, indent=1, default=str))
    summary = {"out": str(out), "studies": len(doc["studies"]), "trials": len(doc["trials"])}
    emit_json(summary) if json_out else console.print(
        f"exported {summary['studies']} studies, {summary['trials']} trials to {out}")


@store_app.command("import")
def import_(
    store: Path = typer.Argument(..., help="SQLite store to add to (created when missing)."),
    file: Path = typer.Argument(..., help="JSON written by `moelab store export`."),
    json_out: bool = typer.Option(False, "--json", help="Print what was added as JSON."),
) -> None:
    """Add the studies and trials of an export; a study already in the store is skipped."""
    from moelab.cli.output import console, emit_json, fail
    from moelab.store import Store, StoreError

    try:
        doc = json.loads(file.read_bytes().decode("utf-8"))
    except FileNotFoundError:
        fail(f"no file at {file}", "give the JSON `moelab store export` wrote")
    except IsADirectoryError:
        fail(f"{file} is a folder", "give the JSON `moelab store export` wrote")
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        hint = ("that looks like a store itself: export it first, `moelab store export " f"{file} -o export.json`"
                if file.read_bytes()[:16].startswith(b"SQLite format 3") else "give the JSON `moelab store export` wrote")
        fail(f"{file} is not JSON ({e}), so it is not a moelab export", hint)
    try:
        with Store(store) as st:
            st.lock("moelab store import")
            try:
                added = st.import_doc(doc)
            except (ValueError, KeyError, TypeError) as e:
                fail(f"{file}: {e}")
    except StoreError as e:
        fail(str(e))
    emit_json(added) if json_out else console.print(
        f"imported {added['studies']} studies, {added['trials']} trials into {store}")


@store_app.command("list")
def list_(
    store: Path = typer.Argument(..., help="SQLite store."),
    json_out: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """The studies in a store, with their trial counts and recommendations."""
    from moelab.cli.output import console, emit_json, fail
    from moelab.store import Store, StoreError

    if not store.exists():
        fail(f"no store at {store}", "give the path `moelab study --store` wrote")
    try:
        st = Store(store)
    except StoreError as e:
        fail(str(e))
    with st:
        rows = [{"id": s["id"], "name": s["name"], "status": s["status"], "trials": len(st.trials(s["id"])),
                 "recommended": (s["recommendation"] or {}).get("label")} for s in st.studies()]
    if json_out:
        emit_json(rows)
        return
    for r in rows:
        console.print(f"{r['id']:>3}  {r['name']:<24} {r['status']:<8} {r['trials']:>4} trials  "
                      f"recommended: {r['recommended'] or '-'}")
