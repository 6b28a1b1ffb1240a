"""Pure statistics over stored trials: confidence intervals, SLO checks, Pareto front, recommendation.

Everything here reads the plain dicts the store returns, so a report can recompute it from the
raw data at any time. Throughput is output tokens/s at the workload's highest concurrency point;
a configuration is measured several times (bench + finalist repeats) and compared by a 95 %
t-interval of the mean; overlapping intervals are called a tie, not a win.
"""
from __future__ import annotations

import math
import shlex
from statistics import mean, stdev

# Two-sided 95 % Student t quantiles by degrees of freedom (scipy is not a core dependency).
_T975 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
         2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045,
         2.042]


def t_interval(xs: list[float]) -> tuple[float, float, float]:
    """(mean, low, high) of a 95 % t-interval; a single value has no spread to estimate (low=high=mean)."""
    m = mean(xs)
    if len(xs) < 2:
        return m, m, m
    t = _T975[len(xs) - 2] if len(xs) - 1 <= len(_T975) else 1.96
    half = t * stdev(xs) / math.sqrt(len(xs))
    return m, m - half, m + half


def slo_failures(point: dict, slo: dict) -> list[str]:
    """Which SLO limits (p90) one load point breaks, in words."""
    out = []
    for name, key in (("ttft_ms", "ttft_p90_ms"), ("itl_ms", "itl_p90_ms"), ("tpot_ms", "tpot_p90_ms"),
                      ("e2e_ms", "e2e_p90_ms")):
        lim, got = slo.get(name), point.get(key)
        if lim is not None and got is not None and got > lim:
            out.append(f"p90 {name[:-3].upper()} {got:.0f} ms > {lim:.0f} ms")
    return out


def primary(metrics: dict | None) -> dict | None:
    """The load point a configuration is ranked by: the highest concurrency that was measured."""
    pts = (metrics or {}).get("points") or []
    return pts[-1] if pts else None


def throughputs(trial: dict) -> list[float]:
    """Every throughput measurement of one trial (one per load repeat at the primary point)."""
    m = trial.get("metrics") or {}
    return [x for x in m.get("repeats", []) if x is not None] or \
        ([primary(m)["output_tps"]] if primary(m) and primary(m).get("output_tps") is not None else [])


# What a study ranks by (`objective:` of the study file); throughput stays the default.
OBJECTIVES = {"throughput": "output tok/s", "goodput": "goodput req/s (requests meeting the SLO)",
              "max_concurrency_at_slo": "concurrent requests within the SLO (p90)"}


def objective_values(trial: dict, objective: str = "throughput") -> list[float]:
    """Every measurement of `objective` in one trial: one per load repeat (a capacity search, for
    max_concurrency_at_slo); goodput falls back to the primary point's where no repeat kept it."""
    if objective == "throughput":
        return throughputs(trial)
    m = trial.get("metrics") or {}
    o = m.get("objective") or {}
    if o.get("name") == objective:
        return [x for x in o.get("values") or [] if x is not None]
    p = primary(m)
    if objective == "goodput" and p is not None and p.get("goodput") is not None:
        return [p["goodput"]]
    return []


def measurements(trial: dict, objective: str = "throughput") -> list[tuple[float, bool]]:
    """Every measurement of `objective` in one trial, each with whether the load generator trusted it
    (its own event loop kept time: load/run.validity). A trial stored before each repeat carried its
    own flag gives all of them its primary point's.

    >>> measurements({"metrics": {"points": [{"output_tps": 9.0, "valid": True}],
    ...                           "repeats": [9.0, 4.0], "repeats_valid": [True, False]}})
    [(9.0, True), (4.0, False)]
    """
    m = trial.get("metrics") or {}
    whole = bool((primary(m) or {}).get("valid", True))
    if objective == "throughput":
        xs, ok = m.get("repeats") or [], m.get("repeats_valid")
    else:
        o = m.get("objective") or {}
        xs, ok = (o.get("values") or [], o.get("valid")) if o.get("name") == objective else ([], None)
    if ok is None or len(ok) != len(xs):
        ok = [whole] * len(xs)
    return [(x, bool(k)) for x, k in zip(xs, ok) if x is not None] or \
        [(x, whole) for x in objective_values(trial, objective)]


def trusted_launches(launches: list[list[tuple[float, bool]]]) -> tuple[list[list[float]], int, bool]:
    """(the values per launch to rank by, how many were set aside, whether they are trusted): a
    configuration with any trusted measurement is ranked on those alone, so one repeat whose client
    lagged neither drags its mean nor marks the whole configuration untrusted; one with none keeps
    them all, marked untrusted.

    >>> trusted_launches([[(900.0, True), (450.0, False)], [(880.0, True)]])
    ([[900.0], [880.0]], 1, True)
    >>> trusted_launches([[(450.0, False)]])
    ([[450.0]], 0, False)
    """
    kept = [[x for x, ok in ls if ok] for ls in launches]
    if any(kept):
        return [ls for ls in kept if ls], sum(len(ls) for ls in launches) - sum(len(ls) for ls in kept), True
    return [[x for x, _ in ls] for ls in launches if ls], 0, False


def identity_key(t: dict) -> str:
    """The configuration a trial measured, as a key: its flags with what the engine reported it ran
    in place of what was asked (engines/effective.identity); two requests that ran the same are one."""
    import json

    from moelab.engines.effective import identity

    return json.dumps(identity(t.get("flags") or {}, t.get("effective")), sort_keys=True, default=str)


def _as_asked(t: dict) -> bool:
    """Every setting the engine reported is the one the trial asked for (a label that names what ran)."""
    return not any(s.get("ran") is not None and s.get("requested") is not None
                   and str(s["ran"]).lower().replace("-", "_") != str(s["requested"]).lower().replace("-", "_")
                   for s in (t.get("effective") or {}).get("settings") or [])


def launch_interval(launches: list[list[float]]) -> tuple[float, float, float, str]:
    """(mean, low, high, over): with two or more launches, a t-interval over the launch means, so the
    interval covers boot-to-boot variance (each launch one observation); with one, over its samples."""
    means = [mean(xs) for xs in launches if xs]
    if len(means) >= 2:
        return (*t_interval(means), "launches")
    xs = [x for ls in launches for x in ls]
    return (*t_interval(xs), "samples") if xs else (0.0, 0.0, 0.0, "samples")


def spread(launches: list[list[float]]) -> dict:
    """Within-launch and across-launch spread as coefficients of variation (None where unmeasured):
    within = pooled standard deviation of the repeats inside a launch; across = that of the launch means."""
    inside = [xs for xs in launches if len(xs) >= 2]
    means = [mean(xs) for xs in launches if xs]
    m = mean(means) if means else 0.0
    within = math.sqrt(sum(stdev(xs) ** 2 for xs in inside) / len(inside)) if inside else None
    across = stdev(means) if len(means) >= 2 else None
    cv = (lambda sd: None if sd is None or not m else round(sd / m, 4))  # noqa: E731
    return {"launches": len(means), "within_cv": cv(within), "across_cv": cv(across)}


def by_config(trials: list[dict], slo: dict, objective: str = "throughput") -> dict[str, dict]:
    """label -> {flags, changes, samples[], trials[], slo_failures[], valid, launches ...} over measured
    ok trials. Trials whose engine ran the same configuration are one entry (its label names what
    ran; `same_as` lists the others). Under an objective other than throughput the SLO is part of
    the objective, not a filter."""
    out: dict[str, dict] = {}
    keyed: dict[str, str] = {}  # identity key -> label of its entry
    twins: set[str] = set()
    for t in trials:
        if t.get("cause") != "ok" or not t.get("metrics"):
            continue
        p = primary(t["metrics"])
        if p is None:
            continue
        key = identity_key(t)
        if key not in keyed:  # the same flags that ran differently in another launch stay apart
            twin = t["label"] in out
            keyed[key] = f"{t['label']} (launch {t['id']} ran otherwise)" if twin else t["label"]
            if twin:
                twins.add(keyed[key])
        label = keyed[key]
        c = out.setdefault(label, {"label": label, "flags": t["flags"], "changes": t["changes"],
                                   "samples": [], "trials": [], "sources": [], "slo_failures": [],
                                   "same_as": [], "launch_samples": [], "tps_samples": [],
                                   "rep_trial": t["id"]})
        if label in twins:
            pass  # same flags as another entry but ran otherwise: its own entry and label
        elif t["label"] != c["label"] and t["label"] not in c["same_as"]:
            if _as_asked(t) and not _as_asked(by_id_in(trials, c["rep_trial"])):  # name it after what ran
                c["same_as"].append(c["label"])
                c.update(label=t["label"], flags=t["flags"], changes=t["changes"], rep_trial=t["id"])
            else:
                c["same_as"].append(t["label"])
        elif t["label"] == c["label"]:
            c["rep_trial"] = t["id"]
        src = t.get("reused_from") or t["id"]  # one stored measurement reused twice counts once
        if src not in c["sources"]:
            c["sources"].append(src)
            c["launch_samples"].append(measurements(t, objective))
            c["tps_samples"] += throughputs(t)
        c["trials"].append(t["id"])
        if objective == "throughput":
            c["slo_failures"] = sorted(set(c["slo_failures"]) | set(slo_failures(p, slo)))
        acc = (t.get("metrics") or {}).get("accuracy")
        if acc is not None:
            c.setdefault("accuracy", []).append(acc["accuracy"])
            if not acc["passed"]:
                c["slo_failures"] = sorted(set(c["slo_failures"]) | {f"below the accuracy gate: {acc['why']}"})
    for c in out.values():
        c["launch_samples"], c["set_aside"], c["valid"] = trusted_launches(c["launch_samples"])
        c["samples"] = [x for ls in c["launch_samples"] for x in ls]
        c["mean"], c["low"], c["high"], c["interval_over"] = launch_interval(c["launch_samples"])
        c.update(spread(c["launch_samples"]), tps_mean=mean(c["tps_samples"]) if c["tps_samples"] else None)
        if c.get("accuracy"):
            c["accuracy"] = round(sum(c["accuracy"]) / len(c["accuracy"]), 4)
    relabelled = {}
    for c in out.values():  # an entry renamed after what ran is found under its new label
        c["same_as"] = [x for x in c["same_as"] if x != c["label"]]
        relabelled[c["label"]] = c
    return {k: c for k, c in relabelled.items() if c["samples"]}


def by_id_in(trials: list[dict], tid: int) -> dict:
    return next(t for t in trials if t["id"] == tid)


def pareto(points: list[dict]) -> list[dict]:
    """Points not dominated in (higher output_tps, lower e2e_p90_ms), sorted by throughput."""
    pts = [p for p in points if p.get("output_tps") is not None and p.get("e2e_p90_ms") is not None]
    front = [p for p in pts if not any(q["output_tps"] >= p["output_tps"] and q["e2e_p90_ms"] <= p["e2e_p90_ms"]
                                       and (q["output_tps"], q["e2e_p90_ms"]) != (p["output_tps"], p["e2e_p90_ms"])
                                       for q in pts)]
    return sorted(front, key=lambda p: p["output_tps"])


def distance(c: dict, base: dict) -> int:
    """How many flags a configuration changes from the known-good baseline."""
    return sum(1 for k, v in (c.get("changes") or []) if base.get(k) != v)


def ranked(trials: list[dict], slo: dict, base: dict | None = None, objective: str = "throughput") -> list[dict]:
    """Configurations that meet the SLOs with a valid measurement, best mean of the objective first.

    A configuration is ranked on its trusted measurements (by_config: a repeat whose client lagged
    is set aside). When none of its measurements is trusted (a loaded 2-core machine can delay the
    client itself) and no other configuration's is either, they are ranked rather than none, each
    still marked `valid: False`."""
    every = [c for c in by_config(trials, slo, objective).values() if not c["slo_failures"]]
    cfg = [c for c in every if c["valid"]] or every
    return sorted(cfg, key=lambda c: (-c["mean"], distance(c, base or {})))


def command_line(trial: dict) -> str:
    """The launch command of a trial as a user would type it: its environment (secrets masked),
    the engine's own form of the command, and no port moelab picked for the trial (the engine's
    default applies, or `{port}` where the command line had that placeholder)."""
    from moelab.engines import ENGINES

    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted((trial.get("env") or {}).items()))
    argv = list(trial.get("command") or trial.get("args") or [])
    engine = trial.get("engine") or "embedded"
    if engine in ENGINES:
        argv = ENGINES.create(engine).display_command(list(trial.get("args") or []), argv)
    return (env + " " if env else "") + shlex.join(argv)


def interval_text(c: dict) -> str:
    """`95% CI 2363.3-2973.9, n=4`, or `measured once` where one sample gives no interval; with
    `over 3 launches` where the interval is over launch means (boot-to-boot variance included)."""
    n = len(c["samples"]) if "samples" in c else c["n"]
    low, high = (c["low"], c["high"]) if "low" in c else c["ci95"]
    if n < 2:
        return "measured once"
    over = c.get("interval_over")
    k = c.get("launches")
    aside = f", {c['set_aside']} set aside (the client lagged)" if c.get("set_aside") else ""
    return f"95% CI {low:.1f}-{high:.1f}, n={n}" + (f" over {k} launches" if over == "launches" else
                                                   " in one launch" if k == 1 else "") + aside


def value_text(c: dict) -> str:
    """`2632.6 tok/s`, `12.40 req/s within the SLO`, `6.0 concurrent within the SLO`: a brief's value."""
    obj = c.get("objective") or "throughput"
    v = c.get("value", c.get("output_tps"))
    return {"throughput": f"{v:.1f} tok/s", "goodput": f"{v:.2f} req/s within the SLO",
            "max_concurrency_at_slo": f"{v:.1f} concurrent within the SLO"}[obj]


def objective_text(rec: dict) -> str:
    """`2668.6 output tok/s` or `12.40 goodput req/s (requests meeting the SLO)`: a value in its unit."""
    obj = rec.get("objective") or "throughput"
    v = rec.get("value", rec.get("output_tps"))
    return f"{v:.1f} {OBJECTIVES[obj]}" if obj != "goodput" else f"{v:.2f} {OBJECTIVES[obj]}"


def recommend(trials: list[dict], slo: dict, base: dict | None = None, objective: str = "throughput") -> dict | None:
    """The fastest correct configuration under the SLOs, measured more than once, with its interval.

    Only a configuration with repeated measurements can be recommended (the strategies measure a
    single measurement that looks best again, as a finalist); where none has, the best single one
    is returned marked `measured_once`. Overlapping intervals are a tie, and then the fewest changes
    from the baseline decide; `decided_by` says which rule picked it.
    """
    base = base or {}
    r = ranked(trials, slo, base, objective)
    if not r:
        return None
    repeated = [c for c in r if len(c["samples"]) > 1]
    pool = repeated or r
    best, decided = pool[0], "fastest" if repeated else "measured once"
    ties = [c for c in pool[1:] if c["high"] >= best["low"] and best["high"] >= c["low"]] if repeated else []
    if ties:
        group = sorted([best, *ties], key=lambda c: (distance(c, base), -c["mean"]))
        if group[0] is not best:
            decided = "fewest changes among tied"
        best, ties = group[0], group[1:]
    by_id = {t["id"]: t for t in trials}
    src = by_id[best.get("rep_trial") or best["trials"][-1]]

    def brief(c: dict) -> dict:
        return {"label": c["label"], "output_tps": c["mean"] if objective == "throughput" else c.get("tps_mean"),
                "value": c["mean"], "objective": objective, "ci95": [c["low"], c["high"]], "n": len(c["samples"]),
                "launches": c.get("launches"), "interval_over": c.get("interval_over"),
                "within_cv": c.get("within_cv"), "across_cv": c.get("across_cv"), "same_as": c.get("same_as", []),
                "set_aside": c.get("set_aside", 0)}

    gated = [brief(c) | {"why": "; ".join(c["slo_failures"])} for c in by_config(trials, slo, objective).values()
             if any(f.startswith("below the accuracy gate") for f in c["slo_failures"]) and c["mean"] > best["mean"]]
    return {**brief(best), "flags": best["flags"], "changes": best["changes"], "command": command_line(src),
            "accuracy": best.get("accuracy"), "faster_below_accuracy_gate": gated,
            "trial": src["id"], "valid": best["valid"], "decided_by": decided, "measured_once": not repeated,
            "tie": [brief(c) for c in ties], "unrepeated_faster": [brief(c) for c in r if len(c["samples"]) < 2
                                                                   and c["mean"] > best["mean"]],
            "runner_up": next((brief(c) for c in pool if c is not best), None)}


def tie_sentence(rec: dict) -> str:
    """What the tie means, in the words of the rule that decided it (same figures as the table)."""
    if not rec.get("tie"):
        return ""
    tied = "; ".join(f"`{t['label']}` {value_text(t)} ({interval_text(t)})" for t in rec["tie"])
    why = ("the pick is the one with the fewest changes from the baseline"
           if rec.get("decided_by") == "fewest changes among tied"
           else "the pick is also the fastest of them")
    return f"Statistically tied with: {tied}. The intervals overlap, so this is a tie, not a win; {why}."
