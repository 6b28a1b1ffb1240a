"""The processes of a multi-rank launch: rank 0 leads, the others follow, and they die together.

Rank 0 (`moelab serve --tp-size N` itself) opens the store, starts ranks 1..N-1 as
`python -m moelab.engine.parallel.worker` with its own stdout/stderr (so all ranks' lines
interleave in one log, each with its `[... TPr]` prefix), serves HTTP, schedules, and sends every
step to the others before running its own part of it. The contracts that keep a failure bounded:

  * rank 0 watches its children (`Leader._watch`, every 0.1 s): a rank that exits or is killed
    makes rank 0 log `moelab.engine error: rank R (pid P) was killed by signal 9 (SIGKILL)` (or
    `exited with status S`), end every other rank and exit 1, within a fraction of a second;
  * a collective that fails on rank 0 first asks whether a rank died (then the death is the
    cause and the collective its consequence), else logs `moelab.engine error: collective
    <op> timed out / failed on rank 0` (a `collective_error` of its own);
  * the other ranks die with rank 0 (PR_SET_PDEATHSIG, or a thread watching the parent pid), fail
    their collectives after `--dist-timeout` when rank 0 stops sending, and ignore SIGTERM/SIGINT:
    rank 0 turns those into a STOP command, and they exit 0.
"""
from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import threading
import time
import traceback
from dataclasses import asdict
from typing import NoReturn

from moelab.engine.parallel import plan as P
from moelab.engine.parallel import ranklog
from moelab.engine.parallel.group import CollectiveError, Collectives, open_store, store_barrier

HEARTBEAT_S = 0.5  # rank 0 sends IDLE at least this often while it has nothing to run


def describe_exit(rc: int) -> str:
    """'was killed by signal 9 (SIGKILL)' / 'exited with status 1', for a Popen return code."""
    if rc < 0:
        try:
            name = signal.Signals(-rc).name
        except ValueError:
            name = "unknown signal"
        return f"was killed by signal {-rc} ({name})"
    return f"exited with status {rc}"


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


class RankLink:
    """What every rank of the launch has: its rank, the parallel sizes, the store, later the groups."""

    def __init__(self, rank: int, cfg, store) -> None:
        self.rank, self.cfg, self.store = rank, cfg, store
        self.ranks = cfg.parallelism.ranks
        self.groups: Collectives | None = None

    def join(self, model, device: str) -> None:
        """Wait for every rank to finish loading, then make the process groups; the model's
        all-reduces go through them from now on."""
        store_barrier(self.store, "loaded", self.ranks)
        self.groups = Collectives(self.rank, self.ranks, self.store, device, self.cfg.dist_timeout,
                                  custom_all_reduce=not self.cfg.disable_custom_all_reduce)
        model.comm = self.groups

    def barrier(self, name: str) -> None:
        store_barrier(self.store, name, self.ranks)


class Leader(RankLink):
    """Rank 0: starts and watches the other ranks, sends them each command, and has the one way out."""

    def __init__(self, cfg) -> None:
        ranklog.install(0, stdout=False)  # stdout may carry the --json document
        store = open_store("127.0.0.1", cfg.nccl_port or 0, cfg.parallelism.ranks, True, cfg.dist_timeout)
        super().__init__(0, cfg, store)
        self.procs: list[subprocess.Popen] = []
        self._stopping = False
        self._dying = threading.Lock()
        self._last_send = time.monotonic()
        # the other ranks serve no HTTP: the API key stays out of their command lines (and `ps`)
        conf = json.dumps({k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(cfg).items()
                           if k != "api_key"})
        for r in range(1, self.ranks):
            self.procs.append(subprocess.Popen(
                [sys.executable, "-m", "moelab.engine.parallel.worker", "--rank", str(r), "--store",
                 f"127.0.0.1:{store.port}", "--parent", str(os.getpid()), "--config", conf],
                stdin=subprocess.DEVNULL, stdout=sys.__stderr__.fileno()))  # stdout may carry --json
        threading.Thread(target=self._watch, name="moelab-ranks", daemon=True).start()

    @property
    def pids(self) -> list[int]:
        return [os.getpid()] + [p.pid for p in self.procs]

    # -- commands ----------------------------------------------------------------------------
    def send(self, cmd: P.Command) -> None:
        self.groups.send(cmd)
        self._last_send = time.monotonic()

    def send_step(self, prefill, decode) -> None:
        self.send(P.step_command(prefill, decode))

    def idle(self) -> None:
        if time.monotonic() - self._last_send >= HEARTBEAT_S:
            self.send(P.Command(P.Kind.IDLE))

    # -- endings -----------------------------------------------------------------------------
    def _dead(self, wait_s: float) -> list[tuple[int, subprocess.Popen]]:
        """Ranks that have exited, waiting up to wait_s for one to (its sockets close before the
        kernel reports the exit)."""
        deadline = time.monotonic() + wait_s
        while True:
            dead = [(r, p) for r, p in enumerate(self.procs, 1) if p.poll() is not None]
            if dead or time.monotonic() >= deadline:
                return dead
            time.sleep(0.02)

    def _watch(self) -> None:
        while not self._stopping:
            if self._dead(0):
                self.fail()
            time.sleep(0.1)

    def fail(self, exc: BaseException | None = None) -> NoReturn:
        """Say what failed first, end every rank, exit 1. Safe from any thread; the first caller wins."""
        self._dying.acquire()
        dead = self._dead(1.5 if isinstance(exc, CollectiveError) else 0.0)
        for r, p in dead:
            _say(f"moelab.engine error: rank {r} (pid {p.pid}) {describe_exit(p.returncode)}; "
                 f"stopping the other {self.ranks - 1} rank(s)")
        if isinstance(exc, CollectiveError) and dead:
            _say(f"moelab.engine rank 0: its {exc.op} failed as a consequence: {exc.text}")
        elif isinstance(exc, CollectiveError):
            what = f"timed out after {self.cfg.dist_timeout:g} s (--dist-timeout)" if exc.timed_out else "failed"
            _say(f"moelab.engine error: collective {exc.op} {what} on rank 0 while every rank was alive: {exc.text}")
        elif exc is not None:
            _say("".join(traceback.format_exception(type(exc), exc, exc.__traceback__)).rstrip())
            _say(f"moelab.engine error: rank 0 failed: {type(exc).__name__}: {exc}")
        self.kill_all()
        sys.stderr.flush()
        os._exit(1)

    def kill_all(self) -> None:
        """SIGKILL every other rank and reap it (they ignore SIGTERM)."""
        self._stopping = True
        for p in self.procs:
            if p.poll() is None:
                p.kill()
        for p in self.procs:
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                pass

    def abort(self, exc: BaseException) -> None:
        """An exception on rank 0 during startup: refusals (bad flags, an unreadable model, an
        interrupt) end the other ranks and propagate; anything else is a failure of the launch."""
        from moelab.engine.checkpoint import ModelLoadError
        from moelab.engine.config import ConfigError

        if isinstance(exc, (ConfigError, ModelLoadError, KeyboardInterrupt, SystemExit)):
            self.kill_all()
            return
        self.fail(exc)

    def stop(self, engine_idle: bool = True) -> None:
        """Orderly shutdown: STOP to every rank (when no step is in flight), then reap them."""
        self._stopping = True
        if engine_idle and self.groups is not None and all(p.poll() is None for p in self.procs):
            try:
                self.send(P.Command(P.Kind.STOP))
            except CollectiveError:
                pass
        deadline = time.monotonic() + 5
        for p in self.procs:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        self.kill_all()
        if self.groups is not None:
            self.groups.close()


def die_with_parent(parent: int) -> None:
    """End this process when `parent` ends: PR_SET_PDEATHSIG on Linux, else a watching thread."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(1, signal.SIGKILL, 0, 0, 0) != 0:  # PR_SET_PDEATHSIG = 1
            raise OSError(ctypes.get_errno(), "prctl")
    except (OSError, AttributeError):
        def watch() -> None:
            while os.getppid() == parent:
                time.sleep(0.5)
            os._exit(1)

        threading.Thread(target=watch, name="moelab-parent", daemon=True).start()
    if os.getppid() != parent:  # the parent died before the signal was armed
        os._exit(1)


class Follower(RankLink):
    """Ranks 1..N-1: run what rank 0 sends until STOP."""

    def serve(self, engine) -> None:
        from moelab.engine.build import capture_graphs
        from moelab.engine.parallel import faults
        from moelab.engine.parallel.plan import Shadows
        from moelab.engine.runtime import phase

        shadows, warm = Shadows(), True
        phase("warmup", "waiting for rank 0's steps")
        while True:
            try:
                cmd = self.groups.receive()
            except CollectiveError as e:
                self._collective_failed(e)
            if cmd.kind is P.Kind.IDLE:
                continue
            if cmd.kind is P.Kind.STOP:
                self.groups.close()
                return
            if cmd.kind is P.Kind.STEP:
                if warm:
                    faults.hit(self.rank, "warmup")
                    warm = False
                try:
                    engine.forward_step(*shadows.step(cmd))
                except CollectiveError as e:
                    self._collective_failed(e)
            elif cmd.kind is P.Kind.WARM_MOE:
                engine.model.warm_moe(cmd.arg)
                self.barrier("moe_warm")
            elif cmd.kind is P.Kind.CAPTURE:
                capture_graphs(self.cfg, engine)

    def _collective_failed(self, e: CollectiveError) -> NoReturn:
        if e.timed_out:  # rank 0 stopped sending while alive: the collective itself is the failure
            _say(f"moelab.engine error: collective {e.op} timed out after {self.cfg.dist_timeout:g} s "
                 f"(--dist-timeout) on rank {self.rank}: {e.text}")
        else:  # a peer went away; rank 0 reports which one
            _say(f"moelab.engine rank {self.rank}: its {e.op} failed because a peer rank went away: {e.text}")
        sys.stderr.flush()
        os._exit(1)
