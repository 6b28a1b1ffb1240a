"""The report's data, derived from the store by pure functions: what Markdown and HTML both show.

The recommendation is recomputed from the raw stored trials (not copied from the study row), so
a report of an imported or edited store says what its data supports.
"""
from __future__ import annotations

from moelab.study import ranking

# One colour per cause, used by the matrix, the plots and the progress display's spirit.
COLOURS = {
    "ok": "#2e9d5b", "bad_args": "#d98b1f", "unsupported_arch": "#c9a227", "kernel_resource_limit": "#b5651d",
    "host_oom": "#7b4fb3", "gpu_oom": "#9c5fd6", "illegal_memory_access": "#d23c3c", "jit_compile_error": "#b83280",
    "collective_error": "#6b4c9a", "numerical_nan": "#e0457b", "garbage_output": "#c2185b", "model_load_error": "#8d6e63",
    "port_in_use": "#607d8b", "startup_timeout": "#546e7a", "hang": "#455a64", "killed_external": "#795548",
    "native_crash": "#a33", "orphan_leak": "#ef6c00", "unknown": "#9e9e9e",
}
STAGE_ORDER = ["screen", "grid", "one-factor", "bisect", "bench", "tune", "final", "reference"]


def _show(v) -> str:
    return "on" if v is True else "off" if v in (None, False) else str(v)


def matrix(study: dict, trials: list[dict]) -> dict | None:
    """Verdicts over the first two categorical axes (rows x columns), over every value of the other
    axes: each cell holds its best trial (the fastest that worked, else the most telling failure)
    and every failure in it counted by cause, so a cell that worked somewhere never hides a
    configuration of the same pair that died."""
    axes = [k for k, v in (study.get("axes") or {}).items() if isinstance(v, list)]
    if not axes:
        return None
    rows_axis, cols_axis = axes[0], (axes[1] if len(axes) > 1 else None)
    rows = [_show(v) for v in study["axes"][rows_axis]]
    cols = [_show(v) for v in study["axes"][cols_axis]] if cols_axis else ["-"]
    groups: dict[str, list[dict]] = {}
    for t in trials:
        if t["status"] in ("interrupted", "running") or t["stage"] == "reference":
            continue
        f = t.get("flags") or {}
        r, c = _show(f.get(rows_axis)), (_show(f.get(cols_axis)) if cols_axis else "-")
        if r in rows and c in cols:
            groups.setdefault(f"{r}|{c}", []).append(t)
    cells: dict[str, dict] = {}
    for key, ts in groups.items():
        ok = [t for t in ts if t["cause"] == "ok"]
        tps = lambda t: (ranking.primary(t.get("metrics")) or {}).get("output_tps")  # noqa: E731
        measured = [t for t in ok if tps(t) is not None]
        bad = [t for t in ts if t["cause"] != "ok"]
        launched_bad = [t for t in bad if t["status"] == "done"]
        best = max(measured, key=tps) if measured else (ok[0] if ok else (launched_bad or bad)[0])
        failures: dict[str, list[int]] = {}
        for t in bad:
            failures.setdefault(t["cause"], []).append(t["id"])
        cells[key] = {"cause": best["cause"], "status": best["status"], "trial": best["id"],
                      "tps": tps(best) if best["cause"] == "ok" else None, "n": len(ts), "ok": len(ok),
                      "failures": failures}
    return {"rows_axis": rows_axis, "cols_axis": cols_axis, "rows": rows, "cols": cols, "cells": cells,
            "others": axes[2:] + [k for k, v in (study.get("axes") or {}).items() if not isinstance(v, list)]}


def failures_text(x: dict) -> str:
    """`illegal_memory_access x2 (trials 12, 19)`: a cell's failures, in words."""
    return "; ".join(f"{c} x{len(ids)} (trial{'s' if len(ids) > 1 else ''} {', '.join(map(str, ids[:4]))}"
                     f"{', ...' if len(ids) > 4 else ''})" for c, ids in sorted(x.get("failures", {}).items()))


def search_lines(study: dict) -> list[str]:
    """How the study searched, in sentences: what a budget stopped, which flag values were pruned
    and by what evidence, which numeric knobs mattered at which load."""
    extra = study.get("extra") or {}
    out = []
    if extra.get("budget"):
        out.append(f"STOPPED BY THE BUDGET: {extra['budget']}; the finalists were still measured.")
    if extra.get("stopped"):
        out.append(f"STOPPED: {extra['stopped']}.")
    if extra.get("launches") is not None:
        out.append(f"{extra['launches']} launches.")
    sc = extra.get("screen") or {}
    if sc.get("mode") == "one-factor" and sc.get("best_values"):
        best = "; ".join(f"{k} {', '.join(map(str, v))}" for k, v in sc["best_values"].items())
        out.append(f"Screen: one factor at a time, each axis beside the best configuration so far; best values "
                   f"combined: {best}.")
    for b in extra.get("blamed") or []:
        out.append(f"Pruned {b['flag']} {b['value']} ({b['cause']}, trial {b['trial']}): {b['why']}.")
    for tu in extra.get("tuning") or []:
        parts = []
        for knob, k in (tu.get("knobs") or {}).items():
            eff = ", ".join(f"{share:.0%} at concurrency {c}" for c, share in
                            sorted((k.get("effect") or {}).items(), key=lambda x: int(x[0])))
            state = "flat at this load, left as it was" if k.get("flat") else f"best {k.get('best')}"
            fails = ", ".join(f"{v}: {c}" for v, c in (k.get("failed") or {}).items())
            parts.append(f"{knob}: {state}" + (f" (moved throughput {eff})" if eff else "")
                         + (f"; not usable at {fails}" if fails else ""))
        out.append(f"Tuned {tu['survivor']} in {tu['launches']} launches: " + "; ".join(parts) + ".")
    return out


def short_label(t: dict, categorical: set[str]) -> str:
    """`grouped / fp8 / max-running-requests=16`: a categorical axis shows its value only."""
    parts = [_show(v) if k in categorical else f"{k.lstrip('-')}={_show(v)}" for k, v in t.get("changes") or []]
    return " / ".join(parts) or "baseline"


def curves(trials: list[dict], categorical: set[str] = frozenset()) -> list[dict]:
    """One throughput-latency curve per measured configuration (its first measured trial)."""
    out, seen = [], set()
    for t in trials:
        pts = (t.get("metrics") or {}).get("points") or []
        if t["cause"] != "ok" or not pts or t["label"] in seen:
            continue
        seen.add(t["label"])
        out.append({"label": short_label(t, categorical), "trial": t["id"],
                    "points": [{k: p.get(k) for k in ("concurrency", "output_tps", "e2e_p90_ms", "tpot_p50_ms",
                                                      "ttft_p90_ms")} | {"label": t["label"]} for p in pts]})
    return out


def build(store, study_id: int | None = None) -> dict:
    s = store.study(study_id)
    if s is None and study_id is not None and store.studies():
        ids = ", ".join(str(x["id"]) for x in store.studies())
        raise ValueError(f"{store.path} has no study {study_id}; its studies are {ids} (`moelab store list "
                         f"{store.path}` shows them)")
    if s is None:
        raise ValueError(f"{store.path} holds no study yet: run `moelab study FILE --store {store.path}` first")
    trials = store.trials(s["id"])
    slo = (s["spec"].get("slo") or {})
    finished = [t for t in trials if t["status"] in ("done", "reused")]
    cv = curves(finished, {k for k, v in (s["spec"].get("axes") or {}).items() if isinstance(v, list)})
    obj = s["spec"].get("objective") or "throughput"
    configs = ranking.by_config(finished, slo, obj)
    merged = {x for c in configs.values() for x in c.get("same_as", [])}  # ran as another configuration
    cv = [c for c in cv if c["points"][0]["label"] not in merged]
    points = [p for c in cv for p in c["points"]]
    counts: dict[str, int] = {}
    for t in trials:
        if t["status"] != "interrupted":
            counts[t["cause"]] = counts.get(t["cause"], 0) + 1
    base = s["spec"].get("base") or {}
    bisect = s["spec"].get("strategy") == "bisect"  # a bisect explains one failure; it recommends nothing
    return {"study": s, "trials": trials, "recommendation": None if bisect else ranking.recommend(finished, slo, base, obj),
            "ranked": ranking.ranked(finished, slo, base, obj), "configs": configs, "slo": slo,
            "objective": obj,
            "matrix": matrix(s["spec"], trials), "search": search_lines(s), "curves": cv, "pareto": ranking.pareto(points), "causes": counts}
