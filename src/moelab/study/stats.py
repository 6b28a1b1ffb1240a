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
    for name, key in (("ttft_ms", "ttft_p90_ms"), ("tpot_ms", "tpot_p90_ms"), ("e2e_ms", "e2e_p90_ms")):
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
    for c in out.values():
        c["mean"], c["low"], c["high"] = t_interval(c["samples"]) if c["samples"] else (0.0, 0.0, 0.0)
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
    """The exact launch command of a trial, with its environment, ready to paste."""
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted((trial.get("env") or {}).items()))
    argv = list(trial.get("command") or trial.get("args") or [])
    if argv[1:4] == ["-m", "moelab.cli", "serve"]:  # the embedded engine: `python -m moelab.cli` is `moelab`
        argv = ["moelab", *argv[3:]]
    return (env + " " if env else "") + shlex.join(argv)


def recommend(trials: list[dict], slo: dict, base: dict | None = None) -> dict | None:
    """The fastest correct configuration under the SLOs, with its interval; a tie is called a tie."""
    base = base or {}
    r = ranked(trials, slo, base)
    if not r:
        return None
    best = r[0]
    ties = [c for c in r[1:] if c["high"] >= best["low"] and best["high"] >= c["low"] and len(c["samples"]) > 1
            and len(best["samples"]) > 1]
    if ties:  # among tied configurations prefer the fewest changes from the known-good baseline
        group = sorted([best, *ties], key=lambda c: (distance(c, base), -c["mean"]))
        best, ties = group[0], group[1:]
    by_id = {t["id"]: t for t in trials}
    src = by_id[best["trials"][-1]]
    return {"label": best["label"], "flags": best["flags"], "changes": best["changes"],
            "output_tps": round(best["mean"], 2), "ci95": [round(best["low"], 2), round(best["high"], 2)],
            "n": len(best["samples"]), "command": command_line(src), "trial": src["id"], "valid": best["valid"],
            "tie": [{"label": c["label"], "output_tps": round(c["mean"], 2),
                     "ci95": [round(c["low"], 2), round(c["high"], 2)], "n": len(c["samples"])} for c in ties],
            "runner_up": next(({"label": c["label"], "output_tps": round(c["mean"], 2),
                                "ci95": [round(c["low"], 2), round(c["high"], 2)]} for c in r if c is not best), None)}
