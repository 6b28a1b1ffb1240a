"""Every process a server ever started, and the teardown that ends them all and checks.

A server's tree is found three ways, because engines do not keep their children tidy: the
descendants of the server process (sampled several times a second, so a child that later moves
into its own session or is re-parented to init is still remembered), the trial's cgroup, and an
environment marker (MOELAB_TRIAL=<id>) that every descendant inherits, found by scanning /proc.
Teardown is TERM (plus CONT, so a stopped process can act on it), a grace period, then KILL.
"""
from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

MARKER = "MOELAB_TRIAL"


def environ_of(pid: int) -> dict[str, str] | None:
    """A process's environment from /proc (None when it is gone or not ours to read)."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return None
    return dict(kv.split("=", 1) for kv in raw.decode(errors="replace").split("\0") if "=" in kv)


def marked_pids(marker: str, name: str = MARKER) -> list[int]:
    """Pids whose environment holds name=marker (every descendant of a trial inherits it)."""
    needle = f"{name}={marker}".encode()
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit() and int(d.name) != os.getpid():
            try:
                if needle in (d / "environ").read_bytes().split(b"\0"):
                    out.append(int(d.name))
            except OSError:
                continue
    return out


def _alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _describe(p: psutil.Process) -> str:
    """`pid 7 (python -m sglang.launch_server --tp 8 ...)`: the program's own name, not its path, so
    that the arguments which tell workers apart (`--rank 1`) fit in the text."""
    try:
        argv = p.cmdline()
        if argv:
            argv = [os.path.basename(argv[0]), *argv[1:]]
        return f"pid {p.pid} ({' '.join(argv)[:120] or p.name()})"
    except psutil.Error:
        return f"pid {p.pid}"


@dataclass
class TeardownReport:
    escaped: list[str] = field(default_factory=list)  # alive outside the server's session/group
    survivors: list[str] = field(default_factory=list)  # still alive after KILL
    termed: int = 0
    killed: int = 0
    port_free: bool = True
    gpu_back: bool | None = None  # None: no NVML here
    gpu_note: str = ""
    seconds: float = 0.0

    @property
    def leak(self) -> bool:
        return bool(self.escaped or self.survivors or not self.port_free or self.gpu_back is False)


class ProcessTree:
    """The processes of one trial. `root` is the server (a session leader: start_new_session)."""

    def __init__(self, root_pid: int, marker: str, cgroup_pids=lambda: []) -> None:
        self.root_pid = root_pid
        self.marker = marker
        self._cgroup_pids = cgroup_pids
        self.known: dict[int, psutil.Process] = {}
        self.first_seen: dict[int, str] = {}
        self._add(root_pid)

    def _add(self, pid: int) -> None:
        if pid in self.known or pid == os.getpid():
            return
        try:
            p = psutil.Process(pid)
            p.create_time()  # pins identity: a recycled pid is a different Process
            # Rebind instead of mutating: the sampler thread and the supervisor read `known` concurrently.
            self.known = {**self.known, pid: p}
            self.first_seen = {**self.first_seen, pid: _describe(p)}
        except psutil.Error:
            pass

    def refresh(self, scan_env: bool = False) -> list[psutil.Process]:
        """Add new descendants (and cgroup members, and marked processes); return the alive ones."""
        for p in list(self.known.values()):
            try:
                for c in p.children(recursive=True):
                    self._add(c.pid)
            except psutil.Error:
                pass
        for pid in self._cgroup_pids():
            self._add(pid)
        if scan_env:
            for pid in self._marked():
                self._add(pid)
        return [p for p in self.known.values() if _alive(p)]

    def _marked(self) -> list[int]:
        return marked_pids(self.marker)

    def rss(self, procs: list[psutil.Process] | None = None) -> int:
        total = 0
        for p in self.refresh() if procs is None else procs:
            try:
                total += p.memory_info().rss
            except psutil.Error:
                pass
        return total

    def teardown(self, grace_s: float = 10.0) -> TeardownReport:
        rep = TeardownReport()
        t0 = time.monotonic()
        alive = self.refresh(scan_env=True)
        for p in alive:
            try:
                if p.pid != self.root_pid and (os.getsid(p.pid) != self.root_pid or os.getpgid(p.pid) != self.root_pid):
                    rep.escaped.append(_describe(p) + f" had left the server's session {self.root_pid}")
            except OSError:
                pass
        try:
            os.killpg(self.root_pid, signal.SIGTERM)
        except OSError:
            pass
        for p in alive:
            for sig in (signal.SIGTERM, signal.SIGCONT):
                try:
                    p.send_signal(sig)
                except psutil.Error:
                    pass
        rep.termed = len(alive)
        alive = self._wait(alive, grace_s)
        for _ in range(3):  # KILL, and again for anything forked during the grace period
            alive = alive + [p for p in self.refresh(scan_env=True) if p not in alive]
            if not alive:
                break
            for p in alive:
                try:
                    p.kill()
                    rep.killed += 1
                except psutil.Error:
                    pass
            alive = self._wait(alive, 3.0)
        rep.survivors = [_describe(p) for p in alive]
        rep.seconds = time.monotonic() - t0
        return rep

    @staticmethod
    def _wait(procs: list[psutil.Process], timeout: float) -> list[psutil.Process]:
        deadline = time.monotonic() + timeout
        while True:
            procs = [p for p in procs if _alive(p)]
            if not procs or time.monotonic() > deadline:
                return procs
            time.sleep(0.05)
