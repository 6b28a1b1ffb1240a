"""Supervise one server launch: preflight, spawn, readiness, death or hang, teardown, verdict.

    with Supervisor(spec, out_dir) as srv:
        v = srv.wait_ready()      # None when ready (/health AND one real token, and the probe if
                                  # probe=True), else the Verdict
        srv.url, srv.model        # http://127.0.0.1:PORT, the served model name
        srv.set_phase(Phase.load) # what the caller does now: the phase a death is blamed on
        srv.record(verdict)       # a failed probe/load verdict of the caller's becomes the trial's
        srv.alive_verdict()       # None while alive and answering, else the verdict of its death/hang
    srv.result                    # LaunchResult: verdict, timings, telemetry, trial-folder paths

The server runs in its own session and in a per-trial memory cgroup; its output goes unbuffered,
time-stamped, to server.log. Leaving the `with` block always tears the whole tree down, also on
KeyboardInterrupt; `launch()` turns SIGTERM into the same path.

A death anywhere in the tree counts, not only the root's: a worker OOM-killed by the cgroup, or a
worker that dies with a root error in the log while the launcher above it lives on (and /health may
still answer 200), is the trial's verdict within a second. And when a timeout fires on a server that
is still alive, a root error already in its log is the cause, not the timeout.
"""
from __future__ import annotations

import concurrent.futures as cf
import subprocess
import time
import uuid
from pathlib import Path

from moelab.diagnose import classify
from moelab.formats import probe_class
from moelab.launch import folder, hygiene, kernellog, machine, readiness, verdicts
from moelab.launch.cgroup import MemoryCgroup
from moelab.launch.guardian import Guardian
from moelab.launch.leftovers import OWNER, owner_tag
from moelab.launch.logcapture import LogCapture
from moelab.launch.proctree import MARKER, ProcessTree
from moelab.launch.telemetry import Sampler, gpu_used_total
from moelab.spec import Cause, Evidence, LaunchSpec, Phase, Verdict


def pinned(argv: list[str], cpus: list[int] | None) -> list[str]:
    """argv run on `cpus` only (a packed study's share of the machine), through taskset so that
    the affinity holds from the first instruction and every descendant inherits it."""
    import shutil

    if not cpus or shutil.which("taskset") is None:
        return argv
    return ["taskset", "-c", ",".join(map(str, cpus)), *argv]


def _running(p) -> bool:
    try:
        return p.is_running() and p.status() != "zombie"
    except Exception:  # psutil.NoSuchProcess, AccessDenied
        return False


class Supervisor:
    def __init__(self, spec: LaunchSpec, out_dir: Path, adapter=None, reference: Path | None = None,
                 probe: bool = True, force: bool = False, grace_s: float = 10.0, stall_after_s: float = 60.0,
                 hang_timeout_s: float = 10.0, on_progress=None, use_cgroup: bool = True,
                 flags_checked: bool = False) -> None:
        from moelab.engines import ENGINES

        self.spec, self.reference, self.probe, self.force = spec, reference, probe, force
        self.adapter = adapter or ENGINES.create(spec.engine)
        self.dir = folder.new_trial_dir(Path(out_dir) if out_dir else None)
        self.grace_s, self.stall_after_s, self.hang_timeout_s = grace_s, stall_after_s, hang_timeout_s
        self.on_progress, self.use_cgroup = on_progress, use_cgroup
        self.flags_checked = flags_checked  # the caller (a study's pruning) already ran the adapter's check
        self.port = spec.port
        if spec.api_key is None and self.adapter.api_key_in(spec.args):  # the key the server will want
            self.spec = spec = spec.model_copy(update={"api_key": self.adapter.api_key_in(spec.args)})
        self.url: str | None = None
        self.model: str | None = None
        self.phase = Phase.preflight
        self.verdict: Verdict | None = None  # the first failure seen; None while all is well
        self.result: folder.LaunchResult | None = None
        self.notes: list[str] = []
        self.timings: dict[str, float | None] = {}
        self.proc = self.log = self.tree = self.sampler = self.cgroup = self.guardian = None
        self._ready = False
        self._gone: set[int] = set()  # tree processes seen to end while the root lived
        self._started: dict[int, float] = {}  # when each tree process was first seen
        self._next_tree_check = 0.0
        self.settle_s = 3.0  # after a worker's death, how long the engine may take to end itself
        self._pool = cf.ThreadPoolExecutor(2, thread_name_prefix="moelab-http")

    # -- lifecycle ---------------------------------------------------------------------------
    def __enter__(self) -> "Supervisor":
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, et, ev, tb) -> bool:
        if isinstance(ev, KeyboardInterrupt) and self._ready:
            self.notes.append("stopped by an interrupt of moelab (SIGINT/SIGTERM) after it was ready")
        elif isinstance(ev, KeyboardInterrupt) and self.verdict is None:
            self.verdict = Verdict(cause=Cause.unknown, phase=self.phase, advice="Interrupted; nothing was judged.",
                                   evidence=[Evidence(kind="interrupt", text="moelab was interrupted (SIGINT/SIGTERM)")])
        elif ev is not None and not isinstance(ev, KeyboardInterrupt) and self.verdict is None:
            # The caller's own code failed inside the `with`: never let that pass as ok.
            self.verdict = Verdict(cause=Cause.unknown, phase=self.phase, advice="moelab itself failed; see the error.",
                                   evidence=[Evidence(kind="error", text=f"{type(ev).__name__}: {ev}")])
        self.close()
        return False

    def start(self) -> None:
        self.t0 = time.monotonic()
        # the port the user gave in the engine's own arguments is the one to watch and probe
        host = self.spec.host
        port = self.adapter.port_in(self.spec.args) or self.port or machine.pick_port(host)
        self.port = port
        self.notes.append(machine.host_ram_note())
        bad = machine.check_port(host, port)
        gpu_bad, gpu_notes = machine.check_gpus(self.spec.gpus, self.force)
        self.notes += gpu_notes
        # The adapter's own check (flag catalogue of the installed engine): a bad flag is a verdict
        # before any process starts. MOELAB_NO_FLAG_CHECK=1 leaves the decision to the engine.
        flags_bad = None if self.flags_checked else self.adapter.flag_check(self.spec)
        if bad or gpu_bad or flags_bad:
            self.verdict = bad or gpu_bad or flags_bad
            return
        self.gpu_baseline = gpu_used_total()
        self.phase = Phase.launch
        argv, adapter_env = self.adapter.command(self.spec, port)
        self.argv, self.marker = argv, uuid.uuid4().hex
        env, self.secrets = folder.prepare(self.dir, self.spec, argv, adapter_env, self.spec.api_key)
        env[MARKER] = self.marker  # inherited by every descendant: found again even after setsid
        env[OWNER] = owner_tag()  # a process whose owner is gone is a leftover (moelab doctor finds it)
        self.cgroup = MemoryCgroup(self.spec.memory_limit_bytes, try_cgroup=self.use_cgroup)
        self.notes.append(self.cgroup.note)
        # Started before the server, so no moment exists in which moelab could die and leave it.
        self.guardian = Guardian(self.marker, self.dir, cgroup=self.cgroup.path)
        try:
            self.proc = subprocess.Popen(self.cgroup.wrap(pinned(argv, self.spec.cpus)), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                         stderr=subprocess.STDOUT, env=env, start_new_session=True)
        except OSError as e:  # no such executable (only without the sh wrapper; with it sh exits 127)
            self.guardian.stand_down()
            self.cgroup.remove()
            self.verdict = Verdict(cause=Cause.bad_args, phase=Phase.launch, evidence=[
                Evidence(kind="spawn", text=f"{argv[0]}: {e.strerror or e}")], advice=verdicts.NOT_FOUND_ADVICE)
            return
        self.guardian.root(self.proc.pid)
        self.url = f"http://{host}:{port}"
        self.tree = ProcessTree(self.proc.pid, self.marker, self.cgroup.pids)
        self.log = LogCapture(self.proc.stdout, self.dir / "server.log", self.adapter.phase_of, mask=self.secrets.text)
        self.sampler = Sampler(self.tree, self.log, self.dir / "telemetry.jsonl", lambda: self.proc.poll() is not None,
                               self.cgroup.usage, stall_after_s=self.stall_after_s)

    # -- while running ----------------------------------------------------------------------
    def _progress(self) -> None:
        if self.on_progress and self.sampler:
            s = self.sampler
            self.on_progress({"elapsed_s": time.monotonic() - self.t0, "phase": self.log.phase,
                              "rss_bytes": s.last_rss, "gpu_bytes": s.peak_gpu if s.gpu_seen else None,
                              "stalled_s": s.stalled_for if s.stalled_for >= self.stall_after_s else None})

    def _await(self, fn, *args, timeout: float):
        """Run a blocking HTTP check in the worker thread while watching the process every 0.1 s."""
        fut = self._pool.submit(fn, *args)
        deadline = time.monotonic() + timeout
        while True:
            try:
                return fut.result(timeout=0.1)
            except cf.TimeoutError:
                if self.proc.poll() is not None or time.monotonic() > deadline or self._tree_death() is not None:
                    return None  # the thread finishes on its own (its own socket timeout)
                self._progress()

    def wait_ready(self) -> Verdict | None:
        if self.verdict is not None or self._ready:
            return self.verdict
        deadline, port_seen, checked_owner = self.t0 + self.spec.timeout_s, False, False
        host, notes = self.spec.host, []
        while True:
            if self.proc.poll() is not None:
                return self._died()
            inner = self._tree_death()
            if inner is not None:
                return inner
            if self.log.port_error_at and time.monotonic() - self.log.port_error_at > 1.5:
                return self._fail(classify(self.log.snapshot(), engine=self.adapter.name, phase_hint="launch"))
            if time.monotonic() > deadline:
                last = (len(self.log.lines), self.log.lines[-1]) if self.log.lines else None
                timeout = verdicts.startup_timeout(self.spec.timeout_s, self.log.phase, self.log.phase_line,
                                                   last, self.sampler.stalled_for, port_seen, notes,
                                                   self.stall_after_s)
                return self._fail(self._log_cause(timeout) or timeout)
            self._progress()
            if not readiness.port_open(host, self.port, 0.2):
                time.sleep(0.1)
                continue
            if not port_seen:
                port_seen, self.timings["port_open_s"] = True, time.monotonic() - self.t0
            if not checked_owner:
                checked_owner = True
                holders = machine.port_holders(self.port)
                mine = {p.pid for p in self.tree.refresh()}
                if holders and not any(pid in mine for pid, _ in holders):
                    return self._fail(verdicts.foreign_listener(self.port, holders))
            key = self.spec.api_key
            r = self._await(readiness.health, self.url, self.adapter.health_path(), 2.0, key, timeout=5)
            if r is not None and r.auth_refused:
                return self._fail(verdicts.auth_refused(r.note, key is not None))
            if r is None or not r.ok:
                notes.append(r.note if r else "GET /health did not answer")
                time.sleep(0.2)
                continue
            if self.model is None:
                self.model = self._await(readiness.served_model, self.url, 2.0, key, timeout=5)
            left = max(1.0, deadline - time.monotonic())
            r = self._await(readiness.one_token, self.url, self.model, self.adapter.completion_path(),
                            min(left, 60.0), key, timeout=min(left, 60.0))
            if r is not None and r.auth_refused:
                return self._fail(verdicts.auth_refused(r.note, key is not None))
            if r is None or not r.ok:
                notes.append(r.note if r else "POST /v1/completions did not answer")
                time.sleep(0.2)
                continue
            self.timings["ready_s"] = time.monotonic() - self.t0
            self._ready, self.phase = True, Phase.probe
            self.notes.append(r.note)
            return self._run_probe() if self.probe else None

    def _run_probe(self) -> Verdict | None:
        t = time.monotonic()
        try:
            v = hygiene.run_probe_gate(self.url, self.model, self.reference, self.notes,
                                       probe_class(self.spec.flag("--quantization")), self.spec.api_key)
        except Exception as e:  # the probe could not even talk to the server: did it die or hang?
            self.notes.append(f"probe raised {type(e).__name__}: {e}")
            return self.alive_verdict() or self._fail(Verdict(cause=Cause.unknown, phase=Phase.probe,
                                                              evidence=[Evidence(kind="probe", text=str(e))]))
        self.timings["probe_s"] = time.monotonic() - t
        return None if v is None else (self.alive_verdict() or self._fail(v))

    def set_phase(self, phase: Phase) -> None:
        """Tell the supervisor what the caller is doing now (probe, load), for the phase of a death."""
        self.phase = phase

    def record(self, v: Verdict) -> None:
        """Record the caller's failed verdict (probe/load) as the trial's verdict, if none yet."""
        if not v.ok:
            self._fail(v)

    def alive_verdict(self) -> Verdict | None:
        """None while the server is alive and answers (health and one token), else why not."""
        if self.verdict is not None:
            return self.verdict
        if self.proc is None:
            return None
        if self.proc.poll() is not None:
            return self._died()
        inner = self._tree_death()
        if inner is not None:
            return inner
        notes = []
        key = self.spec.api_key
        for fn, args in ((readiness.health, (self.url, self.adapter.health_path(), self.hang_timeout_s, key)),
                         (readiness.one_token, (self.url, self.model, self.adapter.completion_path(),
                                                self.hang_timeout_s, key))):
            r = self._await(fn, *args, timeout=self.hang_timeout_s + 1)
            if self.proc.poll() is not None:
                return self._died()
            if r is None or not r.ok:
                notes.append(r.note if r else f"no answer within {self.hang_timeout_s:.0f} s")
                break
        if not notes:
            return None
        for _ in range(20):  # an engine that is dying (vLLM answers 500 first) gets 2 s to exit
            if self.proc.poll() is not None:
                return self._died()
            time.sleep(0.1)
        if self.verdict is not None:  # a tree death found while the checks waited
            return self.verdict
        last = (len(self.log.lines), self.log.lines[-1]) if self.log.lines else None
        hang = verdicts.hang(self.phase, notes, self.sampler.stalled_for, last)
        return self._fail(self._log_cause(hang) or hang)

    # -- deaths inside the tree -------------------------------------------------------------
    def _tree_death(self, every_s: float = 0.25) -> Verdict | None:
        """The verdict when a process of the tree died while the root lives: an OOM kill the cgroup
        counted, a kill or segfault the kernel logged for it, or its own root error in the log."""
        if self.verdict is not None:
            return self.verdict
        now = time.monotonic()
        if self.tree is None or now < self._next_tree_check:
            return None
        self._next_tree_check = now + every_s
        ooms = self.cgroup.oom_kills() if self.cgroup is not None else 0
        for pid in self.tree.known:
            self._started.setdefault(pid, now)
        vanished = [p for pid, p in self.tree.known.items()
                    if pid != self.tree.root_pid and pid not in self._gone and not _running(p)]
        if not vanished and not ooms:
            return None
        self._gone.update(p.pid for p in vanished)
        gone = {p.pid: " ".join(self.tree.first_seen.get(p.pid, f"pid {p.pid}").split()) for p in vanished}
        oom = self.cgroup.oom_evidence(self.sampler.last_rss or None)
        killed, segv = kernellog.lines_for(set(self.tree.known)) if (vanished or ooms) else ([], [])
        oom.kernel_lines = killed
        if not gone:  # the OOM count rose before the killed process was reaped: the kernel names it
            import re as _re

            for ln in killed:
                km = _re.search(r"Killed process (\d+)", ln)
                if km and int(km.group(1)) in self.tree.first_seen:
                    pid = int(km.group(1))
                    gone[pid] = " ".join(self.tree.first_seen[pid].split())
                    self._gone.add(pid)
        v = None
        if ooms or killed:
            v = classify(self.log.snapshot(), signal=9, engine=self.adapter.name, oom=oom,
                         phase_hint=(self.phase if self._ready else Phase.launch).value)
            v.evidence = [e for e in v.evidence if e.kind != "exit"]  # the root did not exit: a worker was killed
        elif segv:
            v = classify(self.log.snapshot(), exit_code=-11, engine=self.adapter.name,
                         phase_hint=(self.phase if self._ready else Phase.launch).value)
        elif any(now - self._started.get(p.pid, now) >= 1.5 for p in vanished):
            # a worker (not a short-lived helper) ended: did it leave a root error in the log just now?
            v = self._log_cause(None)
            if v is not None and not any(e.kind == "log" and (e.line or 0) > len(self.log.lines) - 300
                                         for e in v.evidence):
                v = None
        if v is None:
            return None  # a helper process that ended normally (a compiler, a tokenizer job)
        if not vanished and (self.tree.root_pid in gone or ooms):
            # the OOM kill the cgroup counted may be the server process itself, not yet reaped:
            # a killed process exits within milliseconds; if it is gone, that is the root's death
            settle = time.monotonic() + (self.settle_s if self.tree.root_pid in gone else 0.5)
            while self.proc.poll() is None and time.monotonic() < settle:
                time.sleep(0.05)
            if self.proc.poll() is not None:
                return self._died()
        what = ", ".join(gone.values()) or "a process of the tree (the cgroup counted an OOM kill)"
        how = " (SIGKILL from the OOM killer)" if ooms or killed else ""  # the kernel's OOM kill is always SIGKILL
        at = 1 if v.evidence and v.evidence[0].kind == "log" else 0  # the log's own root line stays first
        v.evidence.insert(at, Evidence(kind="tree", text=f"{what} ended{how} while the server process "
                                                         f"(pid {self.tree.root_pid}) was still running"))
        v.evidence.extend(Evidence(kind="kernel_log", text=ln, source="dmesg") for ln in segv[:2])
        v.detail.update(inner_death=True, log_phase=self.log.phase, died_after_s=round(now - self.t0, 3),
                        verdict_after_death_s=round(time.monotonic() - now, 3))
        # an engine that ends itself after a worker died (rank 0 tearing its ranks down) gets a
        # moment to do so: the verdict is the same, and nothing is left for the teardown to kill
        settle = time.monotonic() + self.settle_s
        while self.proc.poll() is None and time.monotonic() < settle:
            time.sleep(0.1)
        return self._fail(v)

    def _log_cause(self, fallback: Verdict | None) -> Verdict | None:
        """A root error already in the log of a live server: the cause, with `fallback` (a timeout,
        a hang) kept as evidence. None when the log names no cause."""
        v = classify(self.log.snapshot(), engine=self.adapter.name,
                     phase_hint=(self.phase if self._ready else Phase.launch).value)
        if v.cause in (Cause.unknown, Cause.killed_external) or v.detail.get("layer") not in ("rule", "structure") \
                or v.detail.get("weak"):  # text that merely looks degenerate or like a leftover is no root error
            return None
        if fallback is not None:
            v.evidence += [Evidence(kind=e.kind, text=e.text, line=e.line, source=e.source) for e in fallback.evidence[:2]]
            v.detail["while"] = fallback.cause.value
        return v

    # -- verdicts ---------------------------------------------------------------------------
    def _fail(self, v: Verdict) -> Verdict:
        if self.verdict is None:
            self.verdict = v
            self.timings["verdict_s"] = time.monotonic() - self.t0
        return self.verdict

    def _died(self) -> Verdict:
        if self.verdict is not None:
            return self.verdict
        noticed = time.monotonic()
        rc = self.proc.poll()
        self.log.drain(0.5)  # the last lines; a grandchild may still hold the pipe open
        oom = self.cgroup.oom_evidence(self.sampler.last_rss or None)
        segv: list[str] = []
        if rc is not None and rc < 0:  # killed by a signal: ask the kernel log about our PIDs
            oom.kernel_lines, segv = kernellog.lines_for(set(self.tree.known))
        v = verdicts.died(self.log.snapshot(), rc, self.adapter.name, oom, segv,
                          self.phase if self._ready else Phase.launch)
        v.detail.update(log_phase=self.log.phase, died_after_s=round(noticed - self.t0, 3),
                        verdict_after_death_s=round(time.monotonic() - noticed, 3))
        return self._fail(v)

    # -- teardown ---------------------------------------------------------------------------
    def close(self) -> folder.LaunchResult:
        if self.result is not None:
            return self.result
        v = self.verdict
        if self.proc is not None:
            if v is None and self.proc.poll() is not None:
                v = self._died()
            rep = self.tree.teardown(self.grace_s)
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                pass
            self.sampler.stop()
            self.log.close()
            rep.port_free = hygiene.wait_port_free(self.spec.host, self.port)
            rep.gpu_back, rep.gpu_note = hygiene.gpu_back(self.gpu_baseline, only=self.spec.gpus)
            if not self.cgroup.remove():
                self.notes.append(f"could not remove {self.cgroup.path}")
            self.guardian.stand_down()
            if v is None:
                v = self._final_ok()
            v = verdicts.with_teardown(v, rep, self.port)
            self.timings["teardown_s"] = rep.seconds
        elif v is None:
            v = self._final_ok()
        self._pool.shutdown(wait=False, cancel_futures=True)
        from moelab.diagnose.tailor import tailor

        if v.advice:  # never advise the value this launch already used
            v = v.model_copy(update={"advice": tailor(v.advice, self.spec.args)})
        self.result = folder.finish(self.dir, v, self.notes, url=self.url, model=self.model, timings=self.timings,
                                   effective=self.effective() if self.log is not None else None,
                                   telemetry={**(self.sampler.summary() if self.sampler else {}),
                                              "cgroup": self.cgroup.note if self.cgroup else None},
                                   launched=self.proc is not None, argv=getattr(self, "argv", []),
                                   secrets=getattr(self, "secrets", folder.Secrets()))
        return self.result

    def effective(self):
        """What the engine's log says this launch ran (engines/effective.py), beside what was asked."""
        from moelab.engines import effective

        return effective.read(self.log.snapshot(), self.spec.args, self.adapter.name)

    def _final_ok(self) -> Verdict:
        return verdicts.ready(self.phase, self.notes) if self._ready else verdicts.not_judged(self.phase)
