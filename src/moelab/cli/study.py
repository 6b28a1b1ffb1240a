"""`moelab study FILE`: run a study (resumable), store every trial, end with the recommendation."""
from __future__ import annotations

from pathlib import Path

import typer

from moelab.cli.app import app


def make_executor(executor: str, parallel: str | None, address: str | None):
    """None (one trial after another, in this thread) for the local executor without --parallel,
    else the executor by name (study/executors); ExecutorError says what is missing."""
    from moelab.study.executors import create

    if executor == "local" and address:
        raise ValueError("--address is the Ray cluster's: give it with --executor ray")
    if executor == "local" and parallel in (None, "1"):
        return None
    if executor == "local":
        return create("local", parallel=parallel)
    return create("ray", address=address, parallel=parallel or "auto")


def run_study_file(study, store_path: Path, *, rerun: bool, json_out: bool, out_dir: Path | None = None,
                   api_key: str | None = None, executor=None) -> dict:
    """Run `study` into `store_path` with the progress display; SIGTERM and SIGHUP tear down like
    Ctrl-C. The store is locked for the run: a second writer is refused, naming this one.
    `executor` (study/executors): where the trials run; None, one after another here."""
    import signal

    from moelab.store import Store
    from moelab.study.progress import Progress
    from moelab.study.runner import StudyRunner
    from moelab.study.strategies import run_study

    def _interrupt(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    old = {s: signal.signal(s, _interrupt) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        with Store(store_path) as store, Progress() as prog:
            store.lock(f"moelab study {study.name}")
            runner = StudyRunner(study, store, out_dir or store_path.with_suffix(".trials"), rerun=rerun, on_event=prog,
                                 api_key=api_key, executor=executor)
            if executor is not None:
                prog.console.print(f"trials run on: {executor.describe()}", highlight=False)
            if runner.reaped:
                prog.console.print(f"ended {len(runner.reaped)} process(es) a killed moelab left behind: "
                                   f"{', '.join(map(str, runner.reaped))}")
            if runner.resumed:
                prog.console.print(f"[bold]resuming[/] study {runner.study_id} in {store_path}"
                                   + (f" ({runner.interrupted} interrupted trial(s) will run again)"
                                      if runner.interrupted else ""))
            return run_study(runner)
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)


def print_summary(summary: dict) -> None:
    from rich.markup import escape

    from moelab.cli.output import console

    rec = summary.get("recommendation")
    causes = ", ".join(f"{k} {v}" for k, v in sorted(summary["causes"].items(), key=lambda kv: -kv[1]))
    console.print(f"\n[bold]{summary['study']}[/] ({summary['strategy']}): {len(summary['trials'])} trials: {causes}")
    if summary.get("budget"):
        console.print(f"[yellow]stopped early:[/] {summary['budget']}")
    if summary.get("stopped"):
        console.print(f"[bold red]stopped:[/] {escape(summary['stopped'])}", soft_wrap=True)
    if summary["strategy"] == "bisect":
        pass  # a bisect explains a failure; it recommends nothing
    elif rec:
        tie = f"  [yellow]tie with {escape(', '.join(t['label'] for t in rec['tie']))}[/]" if rec["tie"] else ""
        from moelab.study.ranking import interval_text, objective_text

        same = f"  (also ran for {escape(', '.join(rec['same_as']))})" if rec.get("same_as") else ""
        console.print(f"[bold green]recommended:[/] {escape(rec['label'])}: {escape(objective_text(rec))} "
                      f"({interval_text(rec)}){tie}{same}")
        console.print(f"  {rec['command']}", soft_wrap=True, markup=False)
    else:
        console.print("[bold red]no configuration worked under the SLOs[/]: see the trials' verdicts")
    b = summary.get("bisect")
    if b and b.get("reproduced"):
        alone = ", ".join(f"{k}: {c}" for k, c in b["alone"].items())
        console.print(f"bisect: {b['cause']} needs all of: {' '.join(f'{k} {v}' for k, v in b['minimal'])} "
                      f"(trial {b['minimal_trial']}); each change alone: {alone}"
                      + ("; the changes interact" if b["interaction"] else ""), markup=False)
    elif b:
        console.print(f"bisect: {b['note']}", markup=False)


def print_plan(st, steps, most: int) -> None:
    from moelab.cli.output import console
    from moelab.study import planner

    console.print(f"plan of {st.name} ({st.strategy}); nothing launched, no store touched", highlight=False)
    for x in steps:
        console.print(f"  {x.stage:<10} {x.launches:>5}  {x.how}", highlight=False, soft_wrap=True)
    console.print(f"  {'total':<10} {most:>5}  launches at most (pruning and reuse lower it); budget.trials "
                  f"{st.budget.trials}, budget.time_s {st.budget.time_s:g}", highlight=False, soft_wrap=True)
    if most > st.budget.trials:
        console.print(f"  [bold yellow]the budget stops it {most - st.budget.trials} launches short[/] "
                      "(the finalists are still measured)", soft_wrap=True)
    full = planner.grid_size(st)
    if st.strategy != "grid" and st.axes:
        console.print(f"  every combination of every axis would be {full:,} launches", highlight=False)


@app.command()
def study(
    file: Path = typer.Argument(..., help="Study file (YAML): engine, model, base flags, axes, workload, SLOs."),
    store: Path = typer.Option(None, "--store", help="SQLite store (default: <file>.db next to the study)."),
    rerun: bool = typer.Option(False, "--rerun", help="Launch again even where the store holds a verdict."),
    report_html: Path = typer.Option(None, "--html", help="Also write the HTML report here."),
    api_key: str = typer.Option(None, "--api-key", help="API key the servers want, sent as a bearer token "
                                "(default: the engine's own --api-key in base, $MOELAB_API_KEY, $OPENAI_API_KEY)."),
    json_out: bool = typer.Option(False, "--json", help="Print the study summary as one JSON document."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the plan (stages, launches at most, the budget) "
                                 "and exit; nothing is launched and the store is not touched."),
    parallel: str = typer.Option(None, "--parallel", help="Trials side by side: N or auto (one per GPU, or per "
                                 "CPU without GPUs), each on its own GPUs or CPU share. Local default 1; "
                                 "with --executor ray, auto (as many as the cluster holds)."),
    executor_name: str = typer.Option("local", "--executor", help="Where trials run: local (this machine) or ray "
                                      "(a Ray cluster; needs moelab's ray extra)."),
    address: str = typer.Option(None, "--address", help="The Ray cluster to use (ray://HOST:10001 or HOST:6379; "
                                "default $RAY_ADDRESS, else a local cluster started for this study)."),
) -> None:
    """Run a study: screen, benchmark and tune engine flags; every trial gets a verdict. Resumable."""
    from moelab.cli.output import emit_json, fail
    from moelab.study import StudyError, load_study
    from moelab.study.prune import unknown_axes

    try:
        st = load_study(file)
    except StudyError as e:
        fail(str(e), "fix the keys named above; examples/*.yaml show every key")
    bad = unknown_axes(st.engine, [*st.axes, *st.base, *(st.reference or {}), *(st.bisect or {})])
    if bad:
        fail(f"{file}: the {st.engine} engine installed here does not accept {', '.join(bad)}",
             f"check the spelling against `{st.engine} --help` (flags keep the engine's own names)")
    from moelab.study import planner

    steps = planner.plan(st)
    most = sum(x.launches for x in steps)
    over = most - st.budget.trials if most > st.budget.trials else 0
    if dry_run:
        if json_out:
            emit_json({"study": st.name, "strategy": st.strategy, "launches_at_most": most,
                       "budget": st.budget.model_dump(), "budget_stops_short_by": over,
                       "full_grid": planner.grid_size(st),
                       "steps": [x.__dict__ for x in steps]})
        else:
            print_plan(st, steps, most)
        raise typer.Exit(0)
    if over:
        from moelab.cli.output import err_console

        err_console.print(f"[bold yellow]budget:[/] the plan has up to {most} launches but budget.trials is "
                          f"{st.budget.trials}: the study stops {over} short of its plan (the finalists are "
                          f"still measured); raise budget.trials to run it all", soft_wrap=True)
    store = store or file.with_suffix(".db")
    from moelab.store import StoreError

    from moelab.study.executors import EXECUTORS, ExecutorError

    if executor_name not in EXECUTORS:
        fail(f"--executor {executor_name}: not one of {', '.join(EXECUTORS)}")
    try:
        ex = make_executor(executor_name, parallel, address)
    except (ExecutorError, ValueError) as e:
        fail(str(e))
    try:
        summary = run_study_file(st, store, rerun=rerun, json_out=json_out, api_key=api_key, executor=ex)
    except StoreError as e:
        fail(str(e))
    except KeyboardInterrupt:
        from moelab.cli.output import err_console

        err_console.print(f"[yellow]interrupted:[/] finished trials are in {store}; run the same command to resume")
        raise typer.Exit(130)
    finally:
        if ex is not None:
            ex.close()
    if report_html:
        from moelab.report import write_reports

        write_reports(store, html=report_html, study_id=summary["study_id"])
        summary["report"] = str(report_html)
    if json_out:
        emit_json(summary)
    else:
        print_summary(summary)
    raise typer.Exit(0 if summary.get("recommendation") or st.strategy == "bisect" else 1)
