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


def by_config(trials: list[dict], slo: dict) -> dict[str, dict]:
    """label -> {flags, changes, samples[], trials[], slo_failures[], valid} over measured ok trials."""
    out: dict[str, dict] = {}
    for t in trials:
        if t.get("cause") != "ok" or not t.get("metrics"):
            continue
        p = primary(t["metrics"])
        if p is None:
            continue
        c = out.setdefault(t["label"], {"label": t["label"], "flags": t["flags"], "changes": t["changes"],
                                        "samples": [], "trials": [], "sources": [], "slo_failures": [],
                                        "valid": True})
        src = t.get("reused_from") or t["id"]  # one stored measurement reused twice counts once
        if src not in c["sources"]:
            c["sources"].append(src)
            c["samples"] += throughputs(t)
        c["trials"].append(t["id"])
        c["slo_failures"] = sorted(set(c["slo_failures"]) | set(slo_failures(p, slo)))
        c["valid"] = c["valid"] and p.get("valid", True)
        acc = (t.get("metrics") or {}).get("accuracy")
        if acc is not None:
            c.setdefault("accuracy", []).append(acc["accuracy"])
            if not acc["passed"]:
                c["slo_failures"] = sorted(set(c["slo_failures"]) | {f"below the accuracy gate: {acc['why']}"})
    for c in out.values():
        c["mean"], c["low"], c["high"] = t_interval(c["samples"]) if c["samples"] else (0.0, 0.0, 0.0)
        if c.get("accuracy"):
            c["accuracy"] = round(sum(c["accuracy"]) / len(c["accuracy"]), 4)
    return out


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


def ranked(trials: list[dict], slo: dict, base: dict | None = None) -> list[dict]:
    """Configurations that meet the SLOs with a valid measurement, best mean throughput first.

    When no measurement is valid (a loaded 2-core machine can delay the client itself), the
    invalid ones are ranked rather than none, each still marked `valid: False`."""
    every = [c for c in by_config(trials, slo).values() if not c["slo_failures"]]
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
    """`95% CI 2363.3-2973.9, n=4`, or `measured once` where one sample gives no interval."""
    n = len(c["samples"]) if "samples" in c else c["n"]
    low, high = (c["low"], c["high"]) if "low" in c else c["ci95"]
    return "measured once" if n < 2 else f"95% CI {low:.1f}-{high:.1f}, n={n}"


def recommend(trials: list[dict], slo: dict, base: dict | None = None) -> dict | None:
    """The fastest correct configuration under the SLOs, measured more than once, with its interval.

    Only a configuration with repeated measurements can be recommended (the strategies measure a
    single measurement that looks best again, as a finalist); where none has, the best single one
    is returned marked `measured_once`. Overlapping intervals are a tie, and then the fewest changes
    from the baseline decide; `decided_by` says which rule picked it.
    """
    base = base or {}
    r = ranked(trials, slo, base)
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
    src = by_id[best["trials"][-1]]

    def brief(c: dict) -> dict:
        return {"label": c["label"], "output_tps": c["mean"], "ci95": [c["low"], c["high"]], "n": len(c["samples"])}

    gated = [brief(c) | {"why": "; ".join(c["slo_failures"])} for c in by_config(trials, slo).values()
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
    tied = "; ".join(f"`{t['label']}` {t['output_tps']:.1f} tok/s ({interval_text(t)})" for t in rec["tie"])
    why = ("the pick is the one with the fewest changes from the baseline"
           if rec.get("decided_by") == "fewest changes among tied"
           else "the pick is also the fastest of them")
    return f"Statistically tied with: {tied}. The intervals overlap, so this is a tie, not a win; {why}."
