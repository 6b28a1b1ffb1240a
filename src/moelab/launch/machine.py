"""Checks before a launch: the port is free, the GPUs hold no foreign processes, free host RAM.

A problem found here becomes a verdict in phase `preflight` without launching anything (a busy
port: port_in_use naming the holder; a busy GPU: gpu_oom naming the processes and their memory,
unless --force). Free host RAM is reported, never refused.
"""
from __future__ import annotations

import socket

import psutil

from moelab.spec import Cause, Evidence, Phase, Verdict


def port_free(host: str, port: int) -> bool:
    """True when nothing listens on host:port (SO_REUSEADDR: a TIME_WAIT leftover does not count)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
            return True
        except OSError:
            return False


def pick_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def port_holders(port: int) -> list[tuple[int, str]]:
    """(pid, command) of the processes listening on `port`, where the OS lets us see them."""
    out = []
    try:
        conns = psutil.net_connections(kind="tcp")
    except (psutil.Error, OSError):
        return out
    for c in conns:
        if c.laddr and c.laddr.port == port and c.status == psutil.CONN_LISTEN and c.pid:
            try:
                out.append((c.pid, " ".join(psutil.Process(c.pid).cmdline())[:100]))
            except psutil.Error:
                out.append((c.pid, "?"))
    return out


def check_port(host: str, port: int) -> Verdict | None:
    if port_free(host, port):
        return None
    holders = port_holders(port)
    who = ", ".join(f"pid {pid} ({cmd})" for pid, cmd in holders) or "a process moelab cannot see"
    return Verdict(cause=Cause.port_in_use, phase=Phase.preflight,
                   evidence=[Evidence(kind="preflight", text=f"{host}:{port} is already in use by {who}")],
                   advice=f"Choose another --port, or end the process holding {port} "
                          "(a stale server from an earlier launch?). Leave --port out to get a free one.")


def check_gpus(gpus: list[int] | None, force: bool = False, found=None) -> tuple[Verdict | None, list[str]]:
    """(verdict if a GPU to be used holds foreign processes and not force, notes).

    `found` is the list of hw.GPU to judge (default: what NVML sees now).
    """
    from moelab.hw import gib, gpus as list_gpus, nvml_status

    found = list_gpus() if found is None else found
    if not found:
        return None, [f"GPUs: {nvml_status()}"]
    notes, busy = [], []
    for g in found:
        if gpus is not None and g.index not in gpus:
            continue
        notes.append(f"GPU {g.index} {g.name} ({g.sm}): {gib(g.memory_free)} free of {gib(g.memory_total)}")
        busy += [f"GPU {g.index}: pid {p.pid} ({p.name or '?'}) holds {gib(p.used_bytes)}" for p in g.processes]
    if not busy:
        return None, notes
    if force:
        return None, notes + [f"--force: going past {b}" for b in busy]
    return Verdict(cause=Cause.gpu_oom, phase=Phase.preflight,
                   evidence=[Evidence(kind="preflight", text=b) for b in busy],
                   advice="Other processes hold the GPUs this launch would use: end them, choose other "
                          "--gpus, or pass --force to launch anyway (GPU memory may then run out)."), notes


def host_ram_note() -> str:
    vm = psutil.virtual_memory()
    return f"host RAM: {vm.available / 2**30:.1f} GiB available of {vm.total / 2**30:.1f} GiB"
