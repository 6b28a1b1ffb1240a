"""`moelab launch -- ENGINE ARGS`: one supervised launch, a verdict, a trial folder."""
from __future__ import annotations

from pathlib import Path

import typer

from moelab.cli.app import app


def _gpus(text: str | None) -> list[int] | None:
    if text is None:
        return None
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        from moelab.cli.output import fail

        fail(f"--gpus {text!r} is not a list of GPU indices", "write e.g. --gpus 0,1")


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
             options_metavar="[OPTIONS] -- ENGINE ARGS...")
def launch(
    ctx: typer.Context,
    engine: str = typer.Option("embedded", "--engine", help="embedded (moelab serve), command (any "
                               "OpenAI-compatible server; {host}/{port} are substituted), or a registered adapter."),
    timeout: float = typer.Option(300.0, "--timeout", help="Seconds to wait for readiness."),
    memory_limit: str | None = typer.Option(None, "--memory-limit", help="Host memory limit for the whole "
                                            "server tree (cgroup), e.g. 16G."),
    gpus: str | None = typer.Option(None, "--gpus", help="GPU indices for the server, e.g. 0,1 (CUDA_VISIBLE_DEVICES)."),
    port: int | None = typer.Option(None, "--port", help="Port to serve on (default: a free one)."),
    out: Path | None = typer.Option(None, "--out", help="Trial folder (default ./moelab-runs/<time>)."),
    reference: Path | None = typer.Option(None, "--reference", help="Reference outputs (REF.json) for the probe."),
    no_probe: bool = typer.Option(False, "--no-probe", help="Ready = health + one token; skip the correctness probe."),
    force: bool = typer.Option(False, "--force", help="Launch even if the GPUs hold foreign processes."),
    keep_running: bool = typer.Option(False, "--keep-running", help="After readiness keep the server up and "
                                      "watch it (every 5 s) until it dies, hangs, or Ctrl-C."),
    api_key: str | None = typer.Option(None, "--api-key", help="API key the server wants, sent as a bearer token "
                                       "(default: $MOELAB_API_KEY, then $OPENAI_API_KEY); never written or printed."),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object (cause, phase, evidence, advice)."),
) -> None:
    """Launch one server configuration under supervision and say whether, and why not, it works.

    Example: moelab launch --memory-limit 8G -- --preset tiny --moe-runner-backend triton
    """
    import sys

    from moelab.cli.output import console, err_console, fail
    from moelab.diagnose.render import verdict_json, verdict_panel
    from moelab.engines import ENGINES
    from moelab.launch import launch as run_launch
    from moelab.launch.cgroup import parse_size
    from moelab.secrets import Secrets, api_key as resolve_key
    from moelab.spec import LaunchSpec

    args = list(ctx.args)
    if engine not in ENGINES:
        fail(f"unknown engine {engine!r}", f"use one of: {', '.join(ENGINES.names())}")
    if timeout <= 0:
        fail(f"--timeout must be positive, got {timeout}", "give the readiness deadline in seconds, e.g. --timeout 600")
    if port is not None and not 0 < port < 65536:
        fail(f"--port {port} is not a TCP port", "give 1-65535, or leave --port out for a free one")
    if reference is not None and not reference.is_file():
        fail(f"no such reference file: {reference}", "record one with `moelab probe --save REF.json`")
    try:
        limit = parse_size(memory_limit) if memory_limit else None
    except ValueError as e:
        fail(str(e), "e.g. --memory-limit 16G")
    key = resolve_key(api_key)
    spec = LaunchSpec(engine=engine, args=args, port=port, gpus=_gpus(gpus), memory_limit_bytes=limit,
                      timeout_s=timeout, api_key=key)
    adapter = ENGINES.create(engine)
    given = adapter.port_in(args)
    if port is not None and given is not None and given != port:
        fail(f"--port {port} for moelab but --port {given} in the engine's arguments",
             "give the port once: the engine's --port is the one moelab watches")
    try:
        adapter.command(spec, port or 0)  # bad usage (no {port}, engine not installed) is exit 2, not a verdict
    except (ValueError, FileNotFoundError) as e:
        fail(str(e), "see `moelab launch --help`")

    status = None
    if not json_out and sys.stderr.isatty():
        status = err_console.status("starting ...")
        status.start()

    def size(n: int | None) -> str:
        return "-" if n is None else f"{n / 2**30:.2f} GiB" if n >= 1 << 30 else f"{n / 2**20:.0f} MiB"

    def progress(p: dict) -> None:
        if status is not None:
            stall = f"  [yellow]stalled {p['stalled_s']:.0f} s[/]" if p.get("stalled_s") else ""
            status.update(f"[bold]{p['phase']}[/]  {p['elapsed_s']:5.1f} s  host {size(p['rss_bytes'])}"
                          f"  GPU {size(p['gpu_bytes'])}{stall}")

    def ready(srv) -> None:
        if keep_running:
            if status is not None:
                status.stop()
            err_console.print(f"ready at {srv.url} (model {srv.model}); watching it, Ctrl-C to stop")

    try:
        res = run_launch(spec, out, reference=reference, probe=not no_probe, force=force,
                         keep_running=keep_running, on_progress=progress, on_ready=ready)
    finally:
        if status is not None:
            status.stop()
    hide = Secrets.gather(env=spec.env, argv=args, extra=[key]).text  # what the trial folder masks
    v = res.verdict
    if json_out:
        typer.echo(verdict_json(v, hide, url=res.url, model=res.model, timings=res.timings,
                                telemetry=res.telemetry, paths=res.paths, command=res.command,
                                effective=res.effective.model_dump() if res.effective else None))
    else:
        t = res.timings
        footer = [f"trial folder: {res.paths.get('dir')}"]
        if v.detail.get("died_after_s") is not None:
            footer.insert(0, f"died {v.detail['died_after_s']:.1f} s after launch, log phase {v.detail.get('log_phase')}")
        if "ready_s" in t:
            footer.insert(0, f"ready in {t['ready_s']:.1f} s at {res.url} (model {res.model})")
        if res.effective is not None and res.effective.reported:
            footer.insert(0, "engine ran: " + ", ".join(f"{x.name.replace('_', ' ')} {x.ran}"
                                                       for x in res.effective.reported))
        peak = res.telemetry.get("peak_rss_bytes")
        if peak:
            footer.insert(0, f"peak host RSS of the tree {size(peak)}")
        console.print(verdict_panel(v, log_name="server.log", footer=footer, mask=hide), soft_wrap=False)
    raise typer.Exit(0 if v.ok else 1)
