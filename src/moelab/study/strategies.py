"""Study drivers: the order in which a strategy asks the runner for trials, and the summary.

Each driver only decides; `StudyRunner.trial` runs or reuses. Every decision is a function of the
results this run has been handed so far (`StudyRunner.seen`, in order), so a resumed study asks
for exactly the same candidates and reuses every finished one.

staged: screen the categorical axes (every combination while few, else one factor at a time and
then the combinations of each axis's best values), then per survivor a line search of each
numeric knob (equal launch budgets), then the finalists measured again. grid / one-factor measure
their plan. All but bisect end with the finalists, even when the budget stopped the plan.
"""
from __future__ import annotations

import json
import time

from moelab.study import planner, ranking, search
from moelab.study.planner import Candidate
from moelab.study.runner import BudgetSpent, StudyRunner, WorkloadRefused


def _reference(r: StudyRunner) -> list[dict]:
    """Launch the reference configuration once and record its greedy answers for every probe."""
    if r.study.reference is None:
        return []
    path = r.out_dir / "reference.json"
    t = r.trial(Candidate(tuple(r.study.reference.items()), "reference", note="probe reference"), loads=0,
                record_reference=path)
    r.reference = path if t["cause"] == "ok" and path.exists() else None
    return [t]


def _measure(r: StudyRunner, cands: list[Candidate]) -> list[dict]:
    return r.trials(cands, loads=1)  # independent candidates: side by side with an executor


def _finalists(r: StudyRunner) -> list[dict]:
    """Run the best configurations again in `final_launches` separate launches, `repeats` load runs
    each, so the interval covers boot-to-boot variance as well as repeats on one server. A
    configuration measured once that still ranks first afterwards is measured again too, so the
    recommendation always rests on repeated measurements. Runs even when the budget is spent."""
    slo, base, obj = r.study.slo.model_dump(), r.study.base, r.study.objective

    def finished() -> list[dict]:
        return [t for t in r.store.trials(r.study_id) if t["status"] in ("done", "reused")]

    def final(c: dict) -> list[dict]:
        ch = tuple((k, v) for k, v in c["changes"] or [])
        return [r.trial(Candidate(ch, "final", rep=i), loads=r.study.staged.repeats)
                for i in range(r.study.staged.final_launches)]

    out = r.trials([Candidate(tuple((k, v) for k, v in c["changes"] or []), "final", rep=i)
                    for c in ranking.ranked(finished(), slo, base, obj)[: r.study.staged.finalists]
                    for i in range(r.study.staged.final_launches)], loads=r.study.staged.repeats)
    for _ in range(r.study.staged.finalists):
        top = ranking.ranked(finished(), slo, base, obj)
        if not top or len(top[0]["samples"]) > 1:
            break
        out += final(top[0])
    return out


def score(t: dict | None, slo: dict, objective: str = "throughput") -> float | None:
    """A trial's throughput at its primary load point (or its mean measure of another objective);
    None where it failed or broke an SLO (what a search treats as a point that does not work). A
    measurement the load generator marked not valid (its own event loop lagged) still counts here:
    it is roughly right, and a point that worked must not look like one that failed; the ranking
    prefers valid measurements. Under goodput or max_concurrency_at_slo the SLO is in the objective."""
    if t is None or t.get("cause") != "ok":
        return None
    p = ranking.primary(t.get("metrics"))
    if p is None or p.get("output_tps") is None:
        return None
    acc = (t.get("metrics") or {}).get("accuracy")
    if acc is not None and not acc["passed"]:
        return None
    if objective != "throughput":
        vals = ranking.objective_values(t, objective)
        return sum(vals) / len(vals) if vals else None
    return None if ranking.slo_failures(p, slo) else p["output_tps"]


def _center(r: StudyRunner, trials: list[dict], center: dict) -> dict:
    """The categorical values of the best measured trial so far (the center unchanged when none)."""
    slo, cat = r.study.slo.model_dump(), r.study.categorical()
    scored = [(score(t, slo, r.study.objective), t) for t in trials]
    scored = [(sc, t) for sc, t in scored if sc is not None]
    if not scored:
        return center
    best = max(scored, key=lambda x: x[0])[1]
    return {n: (best.get("flags") or {}).get(n, center[n]) for n in cat}


def _best_values(r: StudyRunner, by_axis: dict[str, list[dict]]) -> dict[str, list]:
    """Each categorical axis's `keep` best values, by the throughput of the screen launches that
    judged that axis (the axis's center value when none of them was measured)."""
    slo = r.study.slo.model_dump()
    out = {}
    for n, trials in by_axis.items():
        best: dict = {}
        for t in trials:
            sc, v = score(t, slo, r.study.objective), (t.get("flags") or {}).get(n)
            if sc is not None and sc > best.get(v, -1.0):
                best[v] = sc
        out[n] = sorted(best, key=lambda v: -best[v])[: r.study.staged.keep]
    return out


def _screen(r: StudyRunner) -> tuple[list[dict], dict]:
    """Stage 1: the categorical axes with numeric knobs at base, measured in the launch that screened
    them. Factorial while small; else adaptive one factor at a time (each axis's values beside the
    best configuration so far), then every combination of each axis's best values."""
    st = r.study
    loads = 1 if st.staged.bench_in_screen else 0

    def run(cands: list[Candidate]) -> list[dict]:
        if r.executor is None:  # one after another: each screened launch, then its own bench
            ts = [r.trial(c, loads=loads) for c in cands]
            if st.staged.bench_in_screen:
                return ts
            return [r.trial(Candidate(tuple(tuple(c) for c in t["changes"]), "bench"), loads=1)
                    if t["cause"] == "ok" else t for t in ts]
        ts = r.trials(cands, loads=loads)  # side by side: the screen, then the benches of those that came up
        if st.staged.bench_in_screen:
            return ts
        up = [i for i, t in enumerate(ts) if t["cause"] == "ok"]
        benched = r.trials([Candidate(tuple(tuple(c) for c in ts[i]["changes"]), "bench") for i in up], loads=1)
        for i, t in zip(up, benched):
            ts[i] = t
        return ts

    trials = run(planner.screen(st))
    mode = planner.screen_mode(st)
    info: dict = {"mode": mode}
    if mode == "one-factor":
        cat = st.categorical()
        center = {n: st.base.get(n, vals[0]) for n, vals in cat.items()}
        by_axis: dict[str, list[dict]] = {}
        for axis in cat:
            got = run(planner.axis_values(st, center, axis))
            here = [t for t in [*trials, *got] if all((t.get("flags") or {}).get(n) == center[n]
                                                        for n in cat if n != axis)]
            by_axis[axis] = here
            trials += got
            center = _center(r, here, center)
        best = _best_values(r, by_axis)
        best = {n: vals or [center[n]] for n, vals in best.items()}
        seen = {json.dumps(t.get("flags"), sort_keys=True, default=str) for t in trials}
        combos = [c for c in planner.combine(st, best)
                  if json.dumps(c.flags(st.base), sort_keys=True, default=str) not in seen]
        info["best_values"] = best
        trials += run([Candidate(c.changes, "combine") for c in combos])
    info["launches"] = r.launched
    return trials, info


def _tune(r: StudyRunner, survivor: dict, seeded_from: list[dict]) -> dict:
    """Stage 2 for one survivor, `tune_trials` launches (the same for every survivor):
      1. each numeric knob's effect is measured first: one launch half-way from its value toward
         its farther end, the others held;
      2. knobs are then searched in order of that effect (knobs interact: a larger CUDA-graph batch
         only pays once the memory fraction leaves room for the batch), each by a line search on
         its grid (search.next_value), the others at their best so far; two passes at most;
      3. a knob whose three measured points lie within search.FLAT of each other is flat at this
         load and left where it is.
    Launch failures of memory causes at the same numeric values under another survivor are taken
    as known (memory hardly depends on the backend), so they are not launched again."""
    st, slo = r.study, r.study.slo.model_dump()
    numeric = st.numeric()
    cat = [(k, v) for k, v in survivor["changes"] or [] if k not in numeric]
    cur = {k: survivor["flags"].get(k) for k in numeric}
    best_score = survivor["mean"]
    rec: dict = {"survivor": survivor["label"], "start": dict(cur), "launches": 0, "knobs": {}}

    def launch(point: dict) -> dict:
        t = r.trial(Candidate(tuple(cat + [(n, x) for n, x in point.items() if x is not None]), "tune"), loads=1)
        if t["status"] == "done":
            rec["launches"] += 1
        return t

    effect: dict[str, float | None] = {}
    for knob, rg in numeric.items():  # 1. the effect of each knob, before any is tuned
        pts = _points(rg, cur[knob])
        if cur[knob] is None or len(pts) < 2 or rec["launches"] >= st.staged.tune_trials:
            continue
        i = pts.index(cur[knob])
        far = 0 if i > len(pts) - 1 - i else len(pts) - 1
        sc = score(launch({**cur, knob: pts[(i + far) // 2 if abs(far - i) > 1 else far]}), slo, st.objective)
        effect[knob] = None if sc is None else round(sc / max(best_score, 1e-9) - 1, 3)
    order = sorted(numeric, key=lambda k: -abs(effect[k]) if effect.get(k) is not None else 1.0)
    rec["order"], rec["first_probe_effect"] = order, effect
    for _pass in range(2):  # 2. line searches, strongest knob first
        moved = False
        for knob in order:
            pts = _points(numeric[knob], cur[knob])
            target = {**survivor["flags"], **{k: v for k, v in cur.items() if v is not None}}
            hist, tried, seeded = _known(r, target, knob, seeded_from, slo)
            k = rec["knobs"].setdefault(knob, {"tried": {}, "failed": {}, "seeded": {}, "effect": {}, "flat": None})
            while rec["launches"] < st.staged.tune_trials and not _flat(hist):
                v = search.next_value(pts, hist)
                if v is None:
                    break
                t = launch({**cur, knob: v})
                hist[v], tried[v] = score(t, slo, st.objective), t
            ok = {v: sc for v, sc in hist.items() if sc is not None}
            k["tried"].update({str(v): (round(sc, 1) if sc is not None else None) for v, sc in sorted(hist.items())})
            k["failed"].update({str(v): t["cause"] if t["cause"] != "ok" else _unscored(t, slo)
                                for v, t in tried.items() if hist.get(v) is None})
            k["seeded"].update({str(v): note for v, note in seeded.items()})
            k["flat"] = _flat(hist)
            k["effect"].update(_effect(tried))
            if ok:
                v, sc = max(ok.items(), key=lambda kv: kv[1])
                if sc > best_score * (1 + search.FLAT / 3) and v != cur[knob]:  # a real gain, not noise
                    cur[knob], best_score, moved = v, sc, True
            k["best"] = cur[knob]
        if not moved or rec["launches"] >= st.staged.tune_trials:
            break
    rec["best"], rec["best_tps"] = cur, round(best_score, 1)
    return rec


def _unscored(t: dict, slo: dict) -> str:
    """Why a trial that worked still scores nothing: an SLO it broke, or a measurement not valid."""
    p = ranking.primary(t.get("metrics")) or {}
    miss = ranking.slo_failures(p, slo)
    if miss:
        return "SLO: " + "; ".join(miss)
    return "measurement not valid: " + "; ".join(p.get("invalid_reasons") or ["see the trial"])


def _points(rg, value) -> list:
    """The knob's grid, with its current value added when it lies off the grid."""
    pts = search.grid(rg)
    return sorted([*pts, value]) if value is not None and value not in pts else pts


def _known(r: StudyRunner, target: dict, knob: str, seeded_from: list[dict], slo: dict):
    """(scores, trials, seeded notes) by value of `knob` for what this run already measured with
    every other flag as in `target`; plus memory failures at the same numeric values elsewhere."""
    hist, tried, seeded = {}, {}, {}
    rest = {k: v for k, v in target.items() if k != knob}
    for t in r.seen:
        f = t.get("flags") or {}
        if knob in f and {k: v for k, v in f.items() if k != knob} == rest and t["status"] != "interrupted":
            hist[f[knob]], tried[f[knob]] = score(t, slo, r.study.objective), t
    numeric = set(r.study.numeric())
    for t in seeded_from:
        f = t.get("flags") or {}
        v = f.get(knob)
        same = all(f.get(k) == target.get(k) for k in numeric if k != knob)
        phase = (t.get("verdict") or {}).get("phase")
        if same and v not in hist and t.get("cause") in MEMORY and phase == "launch":
            hist[v] = None
            seeded[v] = f"{t['cause']} at launch in trial {t['id']} (another survivor)"
    return hist, tried, seeded


MEMORY = ("gpu_oom",)  # launch failures that depend on memory knobs, hardly on backends


def _flat(hist: dict) -> bool:
    """Three measured points within search.FLAT of each other: the knob does nothing at this load."""
    sc = [s for s in hist.values() if s is not None]
    return len(sc) >= 3 and (max(sc) - min(sc)) / max(max(sc), 1e-9) < search.FLAT


def _effect(tried: dict) -> dict:
    """Per concurrency: how much the knob moved throughput over the points that ran, as a share."""
    by_c: dict[str, list[float]] = {}
    for t in tried.values():
        if t.get("cause") != "ok":
            continue
        for p in (t.get("metrics") or {}).get("points") or []:
            if p.get("output_tps") is not None:
                by_c.setdefault(str(p["concurrency"]), []).append(p["output_tps"])
    return {c: round((max(v) - min(v)) / max(max(v), 1e-9), 3) for c, v in by_c.items() if len(v) >= 2}


def staged(r: StudyRunner) -> dict:
    st, slo = r.study, r.study.slo.model_dump()
    screened, info = _screen(r)
    survivors = ranking.ranked([t for t in screened if t["status"] in ("done", "reused")], slo, st.base, st.objective)
    survivors = survivors[: st.staged.survivors]
    tuning = []
    if st.numeric() and st.staged.tune_trials:
        for s in survivors:
            tuning.append(_tune(r, s, [t for t in r.seen if t["status"] in ("done", "reused")]))
    return {"screen": info, "tuning": tuning}


def grid(r: StudyRunner) -> dict:
    _measure(r, planner.grid(r.study))
    return {}


def one_factor(r: StudyRunner) -> dict:
    _measure(r, planner.one_factor(r.study))
    return {}


def bisect(r: StudyRunner) -> dict:
    """Delta debugging over the failing combination's changes; each change alone is checked too."""
    changes = list(r.study.bisect.items())
    seen: dict[tuple, dict] = {}

    def run(subset: list) -> dict:
        k = tuple(subset)
        if k not in seen:
            seen[k] = r.trial(Candidate(k, "bisect"), loads=1)
        return seen[k]

    full = run(changes)
    if full["cause"] == "ok":
        return {"bisect": {"reproduced": False, "failing": changes,
                           "note": "the combination works here: nothing to bisect"}}
    alone = {f"{k} {v}": run([(k, v)])["cause"] for k, v in changes}
    minimal = planner.ddmin(changes, lambda s: run(s)["cause"] != "ok")
    return {"bisect": {"reproduced": True, "cause": full["cause"], "failing": changes, "minimal": minimal,
                       "alone": alone, "interaction": all(c == "ok" for c in alone.values()) and len(minimal) > 1,
                       "minimal_trial": run(minimal)["id"]}}


DRIVERS = {"staged": staged, "grid": grid, "one-factor": one_factor, "bisect": bisect}


def run_study(r: StudyRunner) -> dict:
    """Run the study's strategy to the end (or the budget) and store the recommendation."""
    t0 = time.monotonic()
    extra, status = {}, "done"
    try:
        _reference(r)
        extra = DRIVERS[r.study.strategy](r)
    except BudgetSpent as e:
        extra, status = {"budget": f"{e}: the study stopped before its plan's end"}, "budget"
    except WorkloadRefused as e:
        extra, status = {"stopped": str(e)}, "stopped"
    except KeyboardInterrupt:
        r.finish(None, "interrupted", {"note": "interrupted; run the same command to resume"})
        raise
    except Exception as e:  # never leave a study marked `running` by a run that is gone
        r.finish(None, "failed", {"error": f"{type(e).__name__}: {e}"})
        raise
    try:
        if r.study.strategy != "bisect":  # a stopped study still measures its finalists
            _finalists(r)
    except KeyboardInterrupt:
        r.finish(None, "interrupted", {"note": "interrupted; run the same command to resume"})
        raise
    except Exception as e:
        r.finish(None, "failed", {"error": f"{type(e).__name__}: {e}"})
        raise
    extra["blamed"] = [{"flag": b.flag, "value": b.value, "cause": b.cause, "trial": b.trial_id, "how": b.how,
                        "why": b.why} for b in r.rules]
    extra["launches"] = r.launched
    trials = r.store.trials(r.study_id)
    rec = None if r.study.strategy == "bisect" else ranking.recommend(  # bisect explains a failure only
        [t for t in trials if t["status"] in ("done", "reused")], r.study.slo.model_dump(), r.study.base,
        r.study.objective)
    r.finish(rec, status, extra)
    return summary(r.store, r.study_id, elapsed_s=time.monotonic() - t0, **extra)


def summary(store, study_id: int, **extra) -> dict:
    """The study as plain data: trials with causes, the recommendation (what --json prints)."""
    s = store.study(study_id)
    trials = store.trials(study_id)
    counts: dict[str, int] = {}
    for t in trials:
        if t["status"] != "interrupted":
            counts[t["cause"] or "?"] = counts.get(t["cause"] or "?", 0) + 1
    return {"study": s["name"], "study_id": study_id, "store": str(store.path), "status": s["status"],
            "strategy": s["spec"]["strategy"], "recommendation": s["recommendation"], "causes": counts,
            "trials": [{"id": t["id"], "stage": t["stage"], "rep": t["rep"], "label": t["label"],
                        "status": t["status"], "cause": t["cause"], "phase": t["phase"],
                        "output_tps": (ranking.primary(t["metrics"]) or {}).get("output_tps"),
                        "reason": _reason(t), "ran_otherwise": ran_otherwise(t)} for t in trials], **extra}


def ran_otherwise(t: dict) -> list[str]:
    """`moe runner --moe-runner-backend: asked triton_kernel, ran flashinfer_cutlass` for each setting
    the engine's log says it replaced or refused (engines/effective.py); empty where it ran as asked."""
    from moelab.engines.effective import Setting

    out = []
    for s in (t.get("effective") or {}).get("settings") or []:
        st = Setting.model_validate(s)
        if st.changed:
            out.append(f"{st.name.replace('_', ' ')}{' ' + st.flag if st.flag else ''}: {st.describe()}")
    return out


def _reason(t: dict) -> str:
    v = t.get("verdict") or {}
    ev = v.get("evidence") or []
    return ev[0]["text"][:200] if ev and t.get("cause") != "ok" else ""
