"""The study runner: planned candidates -> pruning -> trials -> store, resumable at any point.

Every candidate goes through `StudyRunner.trial`: a finished trial of this study is returned as it
is (resume), else pruning may give it a preflight verdict, else it is launched. The store row is
written `running` before launch and completed after, so a kill mid-trial leaves a row that the
next run marks `interrupted` and runs again. SIGTERM becomes KeyboardInterrupt, so the supervisor
tears the server down on the way out.

With an executor (study/executors: `--parallel`, `--executor ray`) `StudyRunner.trials` runs a
stage's independent candidates side by side; each is decided (`_prepare`) and stored (`_begin`,
`_complete`) here, in the driver's thread, which stays the only writer of the store.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

from moelab.spec import Cause, Evidence, LaunchSpec, Phase, Verdict
from moelab.store import Store, TrialStatus, trial_key
from moelab.study import attribute, prune
from moelab.study.planner import Blame, Candidate, blame, to_args
from moelab.study.file import StudyFile


OWNER = "MOELAB_TRIAL_OWNER"  # "<store path>#<trial id>" in the environment of every trial process


def reap_orphans(owner: str, grace_s: float = 3.0) -> list[int]:
    """End the processes a killed moelab left behind for this store: only those whose moelab is
    gone (a live study writing the same store is never touched; the store lock refuses it anyway)."""
    from moelab.launch import leftovers

    found = leftovers.find(lambda env: env.get(OWNER, "").startswith(owner + "#"))
    return leftovers.end(found, grace_s)


def sweep(marks: list[dict[str, str]], grace_s: float = 3.0) -> list[int]:
    """End every process on this machine carrying one of these trials' owner marks, its moelab
    alive or not: the driver's own sweep after an interrupt or a lost worker."""
    from moelab.launch import leftovers

    want = {m.get(OWNER) for m in marks if m.get(OWNER)}
    if not want:
        return []
    return leftovers.end(leftovers.find(lambda env: env.get(OWNER) in want, live_owner=True), grace_s)


class BudgetSpent(Exception):
    """The study's time or trial budget is used up: no new trial starts."""


class WorkloadRefused(Exception):
    """A live server refused every request of the study's workload: every other configuration would
    be launched only to be refused the same way, so the study stops and says what to fix."""


def _refused_workload(t: dict) -> str:
    """Why the study must stop, when trial `t`'s live server refused every request of its load."""
    v = t.get("verdict") or {}
    ev = [e.get("text", "") for e in v.get("evidence") or []]
    if t.get("cause") != Cause.bad_args.value or v.get("phase") != Phase.load.value or \
            not any(x.startswith("every request at concurrency") for x in ev):
        return ""
    said = next((x for x in ev[1:] if x), ev[0])
    return (f"trial {t['id']}: the server refused every request of the study's workload ({said[:240]}); "
            "make `workload:` fit the launch (input_len + output_len within the context length) and run the "
            "study again")


def model_args(study: StudyFile) -> list[str]:
    """The study's server line (`command:`) and the engine's own model argument(s) for `study.model`."""
    from moelab.engines import ENGINES

    return [*study.command, *ENGINES.create(study.engine).model_args(study.model)]


class StudyRunner:
    def __init__(self, study: StudyFile, store: Store, out_dir: Path, *, rerun: bool = False,
                 on_event: Callable[[dict], None] | None = None, fingerprint: dict | None = None,
                 api_key: str | None = None, executor=None) -> None:
        from moelab.secrets import Secrets, api_key as resolve_key

        self.executor = executor  # None: one trial after another in this thread (study/executors)
        self.study, self.store, self.out_dir, self.rerun = study, store, Path(out_dir), rerun
        self.api_key = resolve_key(api_key)
        # every value of the study that is secret, masked in everything the store keeps
        axes = [f"{k}={v}" for k, vals in study.axes.items() if isinstance(vals, list) for v in vals
                if isinstance(v, str)]
        store.secrets = store.secrets + Secrets.gather(env=study.env, flags=study.base, extra=[self.api_key],
                                                       argv=[*study.command, *to_args(study.base), *axes])
        self.on_event = on_event or (lambda e: None)
        self.fingerprint = fingerprint if fingerprint is not None else _fingerprint(study.engine)
        self.study_id, self.resumed = store.open_study(study.name, study.model_dump(mode="json"), self.fingerprint)
        self.owner = str(Path(store.path).resolve())
        self.reaped = reap_orphans(self.owner) if self.resumed else []
        self.interrupted = store.mark_interrupted(self.study_id)
        self.t0 = time.monotonic()
        self.seq = 0
        self.launched = 0
        self.rules: list[Blame] = []  # flag values proven fatal here, with what attributed them
        self.came_up: list[tuple[dict, int]] = []  # (full flags, trial id) of launches that came up
        self.unexplained: list[dict] = []  # deterministic launch failures not attributed yet
        self.failed_keys: dict[str, dict] = {}  # key -> a deterministic launch failure of this study
        self.isolated: set[tuple] = set()  # failures whose suspects were checked alone
        self.isolate = study.strategy == "staged" and study.staged.isolate
        self.begun: set[int] = set()  # trials started (or stored) by this run
        self.seen: list[dict] = []  # every trial handed to the strategy by this run, in order
        self.reference: Path | None = None

    # -- one candidate ----------------------------------------------------------------------
    def spec_for(self, cand: Candidate) -> tuple[dict, LaunchSpec]:
        flags = cand.flags(self.study.base)
        lim = self.study.launch.memory_limit_gib
        spec = LaunchSpec(engine=self.study.engine, args=model_args(self.study) + to_args(flags), env=self.study.env,
                          timeout_s=self.study.launch.timeout_s, memory_limit_bytes=int(lim * 2**30) if lim else None,
                          api_key=self.api_key)
        return flags, spec

    def trial(self, cand: Candidate, loads: int = 1, record_reference: Path | None = None) -> dict:
        """The stored trial for `cand` (loads=0: launch + probe only); runs it when not yet done."""
        if self.executor is not None:
            return self.trials([cand], loads, record_reference)[0]
        job = self._prepare(cand, loads, record_reference)
        if isinstance(job, dict):
            return job
        self._begin(job)
        try:
            out = job.run(on_progress=lambda p: self.on_event({"event": "progress", "id": job.tid, **p}))
        except BaseException:  # Ctrl-C / SIGTERM: the supervisor has torn down; mark it for a rerun
            self._interrupted(job.tid, "moelab was interrupted during this trial")
            raise
        return self._complete(job, out)

    def trials(self, cands: list[Candidate], loads: int = 1, record_reference: Path | None = None) -> list[dict]:
        """The stored trials for `cands`, in order. With an executor the ones that must launch run
        side by side (each decided as it is reached, from what has finished so far); without one,
        one after another. A trial whose worker or node was lost is `interrupted` and runs again
        once. The store is written here, in the driver's thread, only."""
        if self.executor is None:
            return [self.trial(c, loads, record_reference) for c in cands]
        from moelab.study.executors import Lost

        ex, out, jobs, spent = self.executor, [None] * len(cands), {}, None

        def collect() -> None:
            job, res = ex.wait(self.on_event)
            i = jobs.pop(job.tid)
            if isinstance(res, Lost):
                self._interrupted(job.tid, str(res))
                self.on_event({"event": "lost", "trial": self._get(job.tid)})
                if job.attempt == 0:  # once more, elsewhere if the cluster has another place
                    again = self._prepare(cands[i], loads, record_reference, attempt=1)
                    if isinstance(again, dict):
                        out[i] = again
                    else:
                        while not ex.fits_now(again.need):
                            collect()
                        jobs[self._begin(again)] = i
                        ex.submit(again)
                    return
                out[i] = self._get(job.tid)
                self.seen.append(out[i])
            elif isinstance(res, BaseException):
                self._interrupted(job.tid, f"moelab failed during this trial: {type(res).__name__}: {res}")
                raise res
            else:
                out[i] = self._complete(job, res)

        try:
            for i, c in enumerate(cands):
                try:
                    job = self._prepare(c, loads, record_reference)
                except BudgetSpent as e:  # no new trial; the running ones still finish
                    spent = e
                    break
                if isinstance(job, dict):
                    out[i] = job
                    continue
                while not ex.fits_now(job.need):  # its row is written when it starts, not while it waits
                    collect()
                jobs[self._begin(job)] = i
                ex.submit(job)
            while jobs:
                collect()
        except BaseException:  # Ctrl-C, SIGTERM, a failure of moelab: end every running trial
            ex.stop()
            for tid in jobs:
                self._interrupted(tid, "moelab was interrupted during this trial")
            raise
        if spent is not None:
            raise spent
        return out

    def _prepare(self, cand: Candidate, loads: int, record_reference: Path | None, attempt: int = 0):
        """The stored trial when `cand` needs no launch (done before, pruned, reused), else the
        TrialJob of its launch, to be started with `_begin`."""
        from moelab.study.executors import Need, TrialJob

        flags, spec = self.spec_for(cand)
        key = trial_key(spec.engine, self.fingerprint, self.study.model, spec.args, spec.env)
        self.seq += 1
        done = self.store.done_trial(self.study_id, cand.stage, key, cand.rep)
        if done is not None:
            # asked again in this run (a sampler repeating a point): reused quietly; from an earlier run: resumed
            self.on_event({"event": "again" if done["id"] in self.begun else "resumed", "trial": done})
            self._learn(done)
            self.seen.append(done)
            return done
        if cand.stage != "final" and self.spent():  # finalists are measured even after the budget
            raise BudgetSpent(self.spent())
        row = dict(seq=self.seq, stage=cand.stage, rep=cand.rep, label=cand.label, key=key, engine=spec.engine,
                   model=self.study.model, changes=[list(c) for c in cand.changes], flags=flags, args=spec.args,
                   env=spec.env, fingerprint=self.fingerprint)
        need = self.executor.need(spec) if self.executor is not None else Need()
        pre = self._pruned(cand, spec, key, loads, need)
        if pre is not None:
            t = pre(row)
            self._learn(t)
            self.seen.append(t)
            return t
        return TrialJob(tid=0, label=cand.label, spec=spec, out_dir=self.out_dir, flags=flags,
                        workload=self.study.workload, slo=self.study.slo.model_dump(), reference=self.reference,
                        loads=loads, concurrency=self.study.workload.concurrency,
                        record_reference_to=record_reference, accuracy=self.study.accuracy,
                        answers=self.out_dir / "reference-answers.json", objective=self.study.objective,
                        need=need, attempt=attempt,
                        row=row, stage=cand.stage, rep=cand.rep)

    def _begin(self, job) -> int:
        """Write the job's row `running` (just before it starts) and give it its id, folder and marks."""
        tid = job.tid = self.store.begin_trial(self.study_id, **job.row)
        self.begun.add(tid)
        self.on_event({"event": "start", "id": tid, "label": job.label, "stage": job.stage, "rep": job.rep})
        if job.attempt == 0:
            self.launched += 1
        job.out_dir = self.out_dir / f"trial-{tid:04d}"
        # Every process of this trial carries OWNER (kept out of repro.sh, the key and the stored env):
        # after a SIGKILL of moelab, a resume finds and ends them; an interrupt's sweep does too.
        job.spec = job.spec.model_copy(update={"marks": {OWNER: f"{self.owner}#{tid}"}})
        return tid

    def _interrupted(self, tid: int, why: str) -> None:
        self.store.finish_trial(tid, status=TrialStatus.interrupted.value, verdict=Verdict(
            cause=Cause.unknown, phase=Phase.launch, advice="Interrupted; runs again on resume.",
            evidence=[Evidence(kind="interrupt", text=why)]).model_dump(mode="json"))

    def _complete(self, job, out) -> dict:
        """Store a finished launch's outcome (the driver's thread only) and learn from it."""
        self.store.finish_trial(job.tid, status=TrialStatus.done.value, verdict=out.verdict.model_dump(mode="json"),
                                metrics=out.metrics,
                                samples=out.samples, telemetry={**out.telemetry, "timings": out.timings,
                                                                **({"placement": job.placement} if job.placement else {})},
                                paths=out.paths, command=out.command, effective=out.effective)
        t = self._get(job.tid)
        self.on_event({"event": "done", "trial": t})
        self._learn(t)
        self.seen.append(t)
        refused = _refused_workload(t)
        if refused:
            raise WorkloadRefused(refused)
        return t

    def spent(self) -> str:
        """Why no new trial may start, in words, or '' while the budget lasts."""
        b = self.study.budget
        if self.launched >= b.trials:
            return f"the trial budget is spent: {self.launched} launches of budget.trials={b.trials}"
        if time.monotonic() - self.t0 > b.time_s:
            return f"the time budget is spent: {time.monotonic() - self.t0:.0f} s of budget.time_s={b.time_s:g}"
        return ""

    def _get(self, tid: int) -> dict:
        return self.store.trial(tid)

    def _pruned(self, cand: Candidate, spec: LaunchSpec, key: str, loads: int, need=None):
        """A function that stores the trial without launching it, or None when it must launch."""
        v = prune.blamed(cand.flags(self.study.base), self.rules) or prune.same_failure(key, self.failed_keys) \
            or prune.launch_check(spec)
        why = self.executor.refuse(need) if self.executor is not None and v is None else None
        if why:  # no machine of the executor can ever hold it: said at once, never waited on
            v = Verdict(cause=Cause.bad_args, phase=Phase.preflight, evidence=[Evidence(kind="resources", text=why)],
                        advice=f"Lower the trial's parallel sizes to fit the {self.executor.name} executor's largest "
                               "machine, or add a machine that large.")
        reused = None
        if v is None and not self.rerun:  # --rerun: launch even where another study judged this key
            reused = self.store.verdict_for(key, self.study_id, need_metrics=loads > 0, stage=cand.stage)
        if v is None and reused is None:
            return None

        def store(row: dict) -> dict:
            tid = self.store.begin_trial(self.study_id, **row)
            self.begun.add(tid)
            if reused is not None:
                rv = Verdict.model_validate(reused["verdict"])
                rv.evidence.insert(0, Evidence(kind="store", source=f"trial {reused['id']}",
                                               text=f"reused the verdict of trial {reused['id']} (study "
                                                    f"{reused['study_id']}): same engine version, GPU, driver, model, "
                                                    f"flags and env; --rerun launches again"))
                self.store.finish_trial(tid, status=TrialStatus.reused.value, verdict=rv.model_dump(mode="json"),
                                        metrics=reused["metrics"], samples=reused["samples"],
                                        telemetry=reused["telemetry"], paths=reused["paths"],
                                        command=reused["command"], reused_from=reused["id"],
                                        effective=reused.get("effective"))
            else:
                self.store.finish_trial(tid, status=TrialStatus.pruned.value, verdict=v.model_dump(mode="json"))
            t = self._get(tid)
            self.on_event({"event": "pruned" if reused is None else "reused", "trial": t})
            return t

        return store

    def _learn(self, t: dict) -> None:
        """What a finished trial teaches: a launch that came up clears its flag values for attribution;
        a launch-time failure of a cause that does not depend on load (attribute.DETERMINISTIC) is
        attributed to one flag value (named by the error, differing from a launch that came up, the
        error's words, or a one-launch check of each suspect alone) and prunes it from then on."""
        v = t.get("verdict") or {}
        if t["status"] not in ("done", "reused"):
            return
        flags = t.get("flags") or {}
        if v.get("phase") not in (Phase.launch.value, Phase.preflight.value):
            self.came_up.append((flags, t["id"]))
            for u in list(self.unexplained):  # a new launch that came up may explain an earlier failure
                self._attribute(u)
            return
        if t.get("cause") not in attribute.DETERMINISTIC:
            return
        self.failed_keys.setdefault(t["key"], t)
        if not self._attribute(t):
            self.unexplained.append(t)
            if self.isolate:
                self._isolate(t)

    def _attribute(self, t: dict) -> bool:
        v = t.get("verdict") or {}
        texts = [e["text"] for e in v.get("evidence", [])]
        changes = tuple((k, val) for k, val in (t.get("changes") or []))
        b = blame(changes, t["cause"], texts, t["id"])
        if b is None:
            a = attribute.attribute(t.get("flags") or {}, self.study.axes, t["cause"], texts, self.came_up, t["id"])
            if a is None:
                return False
            b = Blame(a.flag, a.value, t["cause"], t["id"], texts[0] if texts else "", how=a.how, why=a.why)
        self._rule(b)
        if t in self.unexplained:
            self.unexplained.remove(t)
        return True

    def _rule(self, b: Blame) -> None:
        if not any((r.flag, r.value) == (b.flag, b.value) for r in self.rules):
            self.rules.append(b)
            self.on_event({"event": "blamed", "flag": b.flag, "value": b.value, "cause": b.cause,
                           "trial": b.trial_id, "how": b.how, "why": b.why})

    def _isolate(self, t: dict) -> None:
        """Launch each suspect value alone over the base (launch + probe, no load): the one that fails
        the same way is blamed; when none does, only this exact combination is known to fail."""
        v = t.get("verdict") or {}
        texts = [e["text"] for e in v.get("evidence", [])]
        flags = t.get("flags") or {}
        sus = [(k, val) for k, val in attribute.suspects(flags, self.study.axes, t["cause"], texts)
               if self.study.base.get(k) != val]
        if len(sus) < 2 or t["key"] in self.isolated:
            return
        self.isolated.add(t["key"])
        for k, val in sus:
            if any((r.flag, r.value) == (k, val) for r in self.rules):
                return
            alone = self.trial(Candidate(((k, val),), "isolate", note=f"suspect of trial {t['id']}"), loads=0)
            av = alone.get("verdict") or {}
            if alone.get("cause") == t["cause"] and av.get("phase") in (Phase.launch.value, Phase.preflight.value):
                self._rule(Blame(k, val, t["cause"], alone["id"], (texts or [""])[0], how="alone",
                                 why=f"{k} {val} alone over the base failed the same way (trial {alone['id']}), "
                                     f"checked for trial {t['id']}"))
                if t in self.unexplained:
                    self.unexplained.remove(t)
                return

    def finish(self, recommendation: dict | None, status: str = "done", extra: dict | None = None) -> None:
        self.store.finish_study(self.study_id, recommendation, status, extra)


def _fingerprint(engine: str) -> dict:
    from moelab import hw
    from moelab.engines import ENGINES

    try:
        version = ENGINES.create(engine).version()
    except Exception:  # an engine that is not installed here still gets a fingerprint
        version = None
    return hw.fingerprint(engine, version)


def failed_verdict(cause: Cause, text: str) -> Verdict:
    return Verdict(cause=cause, phase=Phase.preflight, evidence=[Evidence(kind="study", text=text)])
