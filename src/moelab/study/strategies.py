"""Study drivers: the order in which a strategy asks the runner for trials, and the summary.

Each driver only decides; `StudyRunner.trial` runs or reuses. Because every decision is a
function of stored results (Optuna's sampler is seeded and replayed with the stored values), a
resumed study asks for exactly the same candidates and reuses every finished one.
"""
from __future__ import annotations

import time

from moelab.study import planner, stats
from moelab.study.planner import Candidate
from moelab.study.runner import BudgetSpent, StudyRunner


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
    return [r.trial(c, loads=1) for c in cands]


def _finalists(r: StudyRunner, trials: list[dict]) -> list[dict]:
    """Run the best configurations again (`repeats` load runs each, in a fresh launch). A
    configuration measured once that still ranks first afterwards is measured again too, so the
    recommendation always rests on repeated measurements."""
    slo, base = r.study.slo.model_dump(), r.study.base

    def final(c: dict) -> dict:
        return r.trial(Candidate(tuple((k, v) for k, v in c["changes"] or []), "final"), loads=r.study.staged.repeats)

    out = [final(c) for c in stats.ranked(trials, slo, base)[: r.study.staged.finalists]]
    for _ in range(r.study.staged.finalists):
        finished = [t for t in r.store.trials(r.study_id) if t["status"] in ("done", "reused")]
        top = stats.ranked(finished, slo, base)
        if not top or len(top[0]["samples"]) > 1:
            break
        out.append(final(top[0]))
    return out


def _tune(r: StudyRunner, trials: list[dict]) -> list[dict]:
    """Stage 3: Optuna (seeded TPE) over the numeric axes, on the best survivors, under the SLOs."""
    st, slo = r.study, r.study.slo.model_dump()
    numeric = st.numeric()
    best = stats.ranked(trials, slo, st.base)[: st.staged.survivors]
    if not numeric or not best or st.staged.tune_trials == 0:
        return []
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    opt = optuna.create_study(direction="maximize", sampler=optuna.samplers.TPESampler(seed=0))
    by_label = {c["label"]: c for c in best}
    out = []
    for _ in range(st.staged.tune_trials):
        ot = opt.ask()
        base = by_label[ot.suggest_categorical("survivor", list(by_label))]
        changes = [tuple(c) for c in base["changes"] or [] if c[0] not in numeric]
        for flag, rg in numeric.items():
            if rg.integer:
                v = ot.suggest_int(flag, int(rg.low), int(rg.high), step=int(rg.step or 1), log=rg.log and not rg.step)
            else:
                v = ot.suggest_float(flag, rg.low, rg.high, step=rg.step, log=rg.log and not rg.step)
            changes.append((flag, v))
        t = r.trial(Candidate(tuple(changes), "tune"), loads=1)
        out.append(t)
        p = stats.primary(t.get("metrics"))
        ok = t["cause"] == "ok" and p is not None and not stats.slo_failures(p, slo)
        opt.tell(ot, p["output_tps"] if ok else 0.0)  # a failure or an SLO miss scores nothing
    return out


def staged(r: StudyRunner) -> dict:
    st = r.study
    screen = [r.trial(c, loads=1 if st.staged.bench_in_screen else 0) for c in planner.screen(st)]
    ok = [t for t in screen if t["cause"] == "ok"]
    bench = ok if st.staged.bench_in_screen else _measure(
        r, [Candidate(tuple(tuple(c) for c in t["changes"]), "bench") for t in ok])
    tuned = _tune(r, bench)
    _finalists(r, bench + tuned)
    return {}


def grid(r: StudyRunner) -> dict:
    _finalists(r, _measure(r, planner.grid(r.study)))
    return {}


def one_factor(r: StudyRunner) -> dict:
    _finalists(r, _measure(r, planner.one_factor(r.study)))
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
        extra, status = {"budget": str(e)}, "budget"
    except KeyboardInterrupt:
        r.finish(None, "interrupted", {"note": "interrupted; run the same command to resume"})
        raise
    except Exception as e:  # never leave a study marked `running` by a run that is gone
        r.finish(None, "failed", {"error": f"{type(e).__name__}: {e}"})
        raise
    trials = r.store.trials(r.study_id)
    rec = None if r.study.strategy == "bisect" else stats.recommend(  # bisect explains a failure only
        [t for t in trials if t["status"] in ("done", "reused")], r.study.slo.model_dump(), r.study.base)
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
                        "output_tps": (stats.primary(t["metrics"]) or {}).get("output_tps"),
                        "reason": _reason(t)} for t in trials], **extra}


def _reason(t: dict) -> str:
    v = t.get("verdict") or {}
    ev = v.get("evidence") or []
    return ev[0]["text"][:200] if ev and t.get("cause") != "ok" else ""
