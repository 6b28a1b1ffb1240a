"""The report's data, derived from the store by pure functions: what Markdown and HTML both show.

The recommendation is recomputed from the raw stored trials (not copied from the study row), so
a report of an imported or edited store says what its data supports.
"""
from __future__ import annotations

from moelab.study import stats

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
    """Verdicts over the first two categorical axes (rows x columns), numeric knobs at base."""
    axes = [k for k, v in (study.get("axes") or {}).items() if isinstance(v, list)]
    if not axes:
        return None
    rows_axis, cols_axis = axes[0], (axes[1] if len(axes) > 1 else None)
    rows = [_show(v) for v in study["axes"][rows_axis]]
    cols = [_show(v) for v in study["axes"][cols_axis]] if cols_axis else ["-"]
    cells: dict[str, dict] = {}
    ranked = sorted((t for t in trials if t["status"] != "interrupted"),
                    key=lambda t: STAGE_ORDER.index(t["stage"]) if t["stage"] in STAGE_ORDER else 99)
    for t in ranked:
        f = t.get("flags") or {}
        r, c = _show(f.get(rows_axis)), (_show(f.get(cols_axis)) if cols_axis else "-")
        if r in rows and c in cols and f"{r}|{c}" not in cells:
            cells[f"{r}|{c}"] = {"cause": t["cause"], "status": t["status"], "trial": t["id"],
                                 "tps": (stats.primary(t.get("metrics")) or {}).get("output_tps")}
    # a benchmarked throughput is shown in the cell even when the matrix cell came from the screen
    for t in trials:
        f = t.get("flags") or {}
        key = f"{_show(f.get(rows_axis))}|{_show(f.get(cols_axis)) if cols_axis else '-'}"
        p = stats.primary(t.get("metrics"))
        if key in cells and p and cells[key]["tps"] is None and t["cause"] == "ok":
            cells[key]["tps"] = p.get("output_tps")
    return {"rows_axis": rows_axis, "cols_axis": cols_axis, "rows": rows, "cols": cols, "cells": cells}


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
    points = [p for c in cv for p in c["points"]]
    counts: dict[str, int] = {}
    for t in trials:
        if t["status"] != "interrupted":
            counts[t["cause"]] = counts.get(t["cause"], 0) + 1
    base = s["spec"].get("base") or {}
    bisect = s["spec"].get("strategy") == "bisect"  # a bisect explains one failure; it recommends nothing
    return {"study": s, "trials": trials, "recommendation": None if bisect else stats.recommend(finished, slo, base),
            "ranked": stats.ranked(finished, slo, base), "configs": stats.by_config(finished, slo), "slo": slo,
            "matrix": matrix(s["spec"], trials), "curves": cv, "pareto": stats.pareto(points), "causes": counts}
