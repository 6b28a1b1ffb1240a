"""One study trial at the process edge: supervised launch, probe, load points, verdict.

`run_trial` is the only place a study starts a server. It returns plain data the store keeps:
the LaunchResult (verdict, timings, telemetry, paths), metrics per load point and the raw samples.
A failed probe or a server that died or hung under load becomes the trial's verdict (phase probe
or load) through the supervisor, which also tears the whole tree down on any exit.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from moelab.formats import probe_class
from moelab.spec import LaunchSpec, Phase, Verdict


@dataclass
class TrialOutcome:
    verdict: Verdict
    metrics: dict | None = None  # {"points": [...], "repeats": [tok/s ...]}
    samples: list = field(default_factory=list)  # raw load samples, per point
    telemetry: dict = field(default_factory=dict)
    paths: dict = field(default_factory=dict)
    command: list[str] = field(default_factory=list)
    timings: dict = field(default_factory=dict)
    effective: dict | None = None  # engines/effective.Effective as plain data: what the log says ran


def point_metrics(res, concurrency: int) -> dict:
    """The few numbers the planner, statistics and report use from one LoadResult."""
    m = res.metrics
    return {"concurrency": concurrency, "output_tps": round(m.output_throughput, 3),
            "request_tps": round(m.request_throughput, 3), "ttft_p50_ms": m.ttft_ms.p50, "ttft_p90_ms": m.ttft_ms.p90,
            "tpot_p50_ms": m.tpot_ms.p50, "tpot_p90_ms": m.tpot_ms.p90, "itl_p90_ms": m.itl_ms.p90, "e2e_p50_ms": m.e2e_ms.p50,
            "e2e_p90_ms": m.e2e_ms.p90, "completed": m.completed, "failed": m.failed, "errors": m.errors,
            "goodput": m.goodput, "valid": res.valid, "invalid_reasons": res.invalid_reasons,
            "achieved_concurrency": res.delivered.get("concurrency"), "ttft_mean_ms": m.ttft_ms.mean,
            "server": server_summary(res.server), "findings": list(res.findings)}


def server_summary(w) -> dict | None:
    """The server's own figures of one point, as the store keeps them (load/server_metrics.py)."""
    if w is None:
        return None
    return {**w.model_dump(exclude_none=True, exclude={"url"}), "bound": w.bound}


def accuracy_gate(srv, acc, answers: Path | None, record: bool) -> dict:
    """The task's exact-match accuracy on this server and the paired decision against the reference
    answers; `record`: this is the reference, its answers are written to `answers`."""
    from moelab.evaluate import evaluate, load_answers, save_answers

    ref = load_answers(answers) if answers is not None and answers.exists() and not record else None
    rep = evaluate(srv.url, acc.task, model=srv.model, n=acc.n, concurrency=(acc.concurrency,), reference=ref,
                   confidence=acc.confidence, min_delta=acc.delta)
    run = rep.points[-1].run
    dec = rep.points[-1].decision
    if record and answers is not None:
        save_answers(run, answers)
    reasons = []
    if run.errors:
        reasons.append(f"{run.errors} of {run.n} requests failed")
    if dec is not None and not dec.passed:
        reasons.append(f"accuracy {run.accuracy:.1%} against the reference's {dec.reference_correct / dec.n:.1%}: "
                       f"paired difference {dec.difference:+.1%} < -{dec.delta:.1%} ({dec.lost} lost, "
                       f"{dec.gained} gained of {dec.n})")
    if acc.min is not None and run.accuracy < acc.min:
        reasons.append(f"accuracy {run.accuracy:.1%} < the floor {acc.min:.1%}")
    return {"task": run.task, "n": run.n, "correct": run.correct, "accuracy": round(run.accuracy, 4),
            "concurrency": run.concurrency, "errors": run.errors, "passed": not reasons, "why": "; ".join(reasons),
            "decision": dec.model_dump() if dec is not None else None, "reference": record}


def _client_error(srv, phase: Phase, e: Exception) -> Verdict:
    """A probe/load client error: the server's death or hang explains it, else it is the verdict."""
    from moelab.spec import Cause, Evidence

    return srv.alive_verdict() or srv.record(Verdict(
        cause=Cause.unknown, phase=phase, evidence=[Evidence(kind=phase.value, text=f"{type(e).__name__}: {e}")],
        advice="The server stayed up but the client failed; see the evidence and server.log.")) or srv.verdict


class _Gone(Exception):
    """The server died or hung during a capacity search: the supervisor's verdict says why."""


def capacity_repeat(srv, workload, slo: dict, concurrency: list[int], fmt, reference, r: int, on_progress=None):
    """One capacity search on this server (objective max_concurrency_at_slo): the highest concurrency
    between the workload's lowest and highest whose requests meet the study's SLO at p90. Returns
    (verdict or None, the Capacity, its LoadResults)."""
    from moelab.load import SLO
    from moelab.load.capacity import find

    def watch(step, res) -> None:
        if on_progress:
            on_progress({"phase": f"capacity c={step.value:g} {'meets' if step.met else 'breaks'} the SLO"})
        if res.correctness is not None and not res.correctness.ok:
            srv.record(res.correctness)
        if srv.alive_verdict() is not None:
            raise _Gone()
        if res.metrics.completed == 0 and res.metrics.failed:  # every request refused: not a load that breaks an SLO
            raise _Gone(_refused(srv, res, int(step.value)))

    goal = SLO(**{k: v for k, v in slo.items() if v is not None})
    w = workload.point(concurrency[0], r, goal, fmt)
    try:
        cap, results = find(srv.url, w, goal, "max-concurrency",
                            pct=90.0, start=concurrency[0], limit=max(concurrency), rounds=workload.rounds or 4,
                            model=srv.model, api_key=srv.spec.api_key, reference=reference, on_point=watch)
    except _Gone as e:
        return (e.args[0] if e.args else None) or srv.alive_verdict(), None, []
    except Exception as e:
        return _client_error(srv, Phase.load, e), None, []
    return srv.alive_verdict(), cap, results


def _refused(srv, res, concurrency: int) -> Verdict:
    """A live server that refused every request of a load point: the workload does not fit this
    launch (a prompt longer than its context, a parameter it rejects). bad_args for HTTP 4xx refusals,
    else unknown; the server's own words are the evidence. Never a throughput of 0."""
    from moelab.spec import Cause, Evidence

    failed = [s for s in res.samples if s.kind == "load" and s.error]
    details = [s.error_detail or s.error for s in failed if s.error_detail or s.error]
    statuses = {s.status for s in failed}
    client = bool(statuses) and all(isinstance(x, int) and 400 <= x < 500 for x in statuses)
    errs = ", ".join(f"{k}: {n}" for k, n in sorted(res.metrics.errors.items()))
    ev = [Evidence(kind="load", text=f"every request at concurrency {concurrency} was refused ({errs})")]
    ev += [Evidence(kind="load", text=d[:400]) for d in dict.fromkeys(details)][:2]
    return srv.record(Verdict(
        cause=Cause.bad_args if client else Cause.unknown, phase=Phase.load, evidence=ev,
        advice="The server is up but refused the study's requests: make the workload fit the launch "
               "(input_len + output_len within the context length, or a larger --context-length/"
               "--max-model-len), then run the study again." if client else
               "The server is up but no load request completed; see the evidence and server.log.")) or srv.verdict


def run_trial(spec: LaunchSpec, out_dir: Path, *, flags: dict, workload, slo: dict, reference: Path | None,
              loads: int, concurrency: list[int], record_reference_to: Path | None = None,
              on_progress: Callable[[dict], None] | None = None, accuracy=None,
              answers: Path | None = None, objective: str = "throughput") -> TrialOutcome:
    """Launch, probe (against `reference`), the accuracy gate (`accuracy`, paired with the reference
    answers in `answers`; the reference trial writes them there), then `loads` repeats of every
    load point (0: screen only); under objective max_concurrency_at_slo each repeat is a capacity
    search instead, and its points up to the capacity are the trial's curve."""
    from moelab.launch import Supervisor
    from moelab.load import SLO, run_load
    from moelab.probe import record_reference, run_probe

    points, samples, search = [], [], []
    runs = []  # one per load repeat: (throughput at the primary point, objective value, trusted)
    fmt = probe_class(flags.get("--quantization") if isinstance(flags.get("--quantization"), str) else None)
    # the study's pruning ran the engine's launch check on this spec already: it runs once
    with Supervisor(spec, out_dir, probe=False, on_progress=on_progress, flags_checked=True) as srv:
        v = srv.wait_ready()
        if v is None:
            srv.set_phase(Phase.probe)
            if on_progress:
                on_progress({"phase": "probe"})
            try:
                if record_reference_to is not None:
                    rep = record_reference(srv.url, srv.model, record_reference_to, api_key=srv.spec.api_key)
                else:
                    rep = run_probe(srv.url, srv.model, reference, weight_format=fmt, api_key=srv.spec.api_key)
                srv.record(rep.verdict)
            except Exception as e:  # the probe could not talk to it: did the server die or hang?
                _client_error(srv, Phase.probe, e)
            v = srv.alive_verdict()
        acc = None
        if v is None and accuracy is not None and (loads or record_reference_to is not None):
            if on_progress:
                on_progress({"phase": f"accuracy {accuracy.task}"})
            try:
                acc = accuracy_gate(srv, accuracy, answers, record=record_reference_to is not None)
            except Exception as e:
                v = _client_error(srv, Phase.probe, e)
            v = v or srv.alive_verdict()
        for r in range(loads if v is None else 0):
            srv.set_phase(Phase.load)
            if objective == "max_concurrency_at_slo":
                v, cap, results = capacity_repeat(srv, workload, slo, concurrency, fmt, reference, r, on_progress)
                if v is not None:
                    break
                at = next((res for res in results if cap.answer and res.workload.concurrency == cap.answer), None)
                runs.append((at.metrics.output_throughput if at is not None else None, cap.answer or 0,
                             all(res.valid for res in results)))
                if r == 0:
                    met = sorted((res for st, res in zip(cap.steps, results) if st.met),
                                 key=lambda res: res.workload.concurrency)
                    points += [point_metrics(res, res.workload.concurrency) for res in met]
                    samples += [{"concurrency": res.workload.concurrency,
                                 "samples": [x.model_dump(mode="json") for x in res.samples]} for res in met]
                search.append([{"concurrency": st.value, "met": st.met, "why": st.why} for st in cap.steps])
                continue
            for c in concurrency:
                if on_progress:
                    on_progress({"phase": f"load c={c}" + (f" #{r + 1}" if loads > 1 else "")})
                w = workload.point(c, r, SLO(**slo), fmt)
                try:
                    res = run_load(srv.url, w, model=srv.model, reference=reference, api_key=srv.spec.api_key)
                except Exception as e:
                    v = _client_error(srv, Phase.load, e)
                    break
                if res.correctness is not None and not res.correctness.ok:
                    srv.record(res.correctness)  # wrong answers only at this concurrency: a finding
                v = srv.alive_verdict()
                if v is not None:
                    break
                pm = point_metrics(res, c)
                if pm["completed"] == 0 and pm["failed"]:
                    v = _refused(srv, res, c)
                    break
                if r == 0:
                    points.append(pm)
                    samples.append({"concurrency": c, "samples": [s.model_dump(mode="json") for s in res.samples]})
                if c == concurrency[-1]:
                    runs.append((pm["output_tps"], pm["goodput"], res.valid))
            if v is not None:
                break
    result = srv.result
    # `repeats_valid` beside `repeats`: whether the load generator trusted each one (its own loop kept
    # time), so one lagging repeat is set aside instead of casting doubt on the whole configuration.
    tps = [(x, ok) for x, _, ok in runs if x is not None]
    metrics = {"points": points, "repeats": [x for x, _ in tps], "repeats_valid": [ok for _, ok in tps]} \
        if points or runs else None
    if metrics is not None and objective != "throughput":
        metrics["objective"] = {"name": objective, "values": [v for _, v, _ in runs],
                                "valid": [ok for _, _, ok in runs]}
        if search:
            metrics["search"] = search  # every capacity search: the concurrency tried, met or why not
    if acc is not None:
        metrics = {**(metrics or {}), "accuracy": acc}
    return TrialOutcome(verdict=result.verdict, metrics=metrics, samples=samples, telemetry=result.telemetry,
                        paths=result.paths, command=result.command, timings=result.timings,
                        effective=result.effective.model_dump() if result.effective else None)
