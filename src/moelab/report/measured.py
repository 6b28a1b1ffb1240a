"""What was measured, for the report: what each launch ran (beside what it asked), requests that
ran the same configuration, the server's own metrics beside the client's, points bounded by
capacity rather than speed, and the spread within and across launches.

Pure functions over the report's data (build.py); markdown.py and html.py render the sections.
"""
from __future__ import annotations

from html import escape

from moelab.engines.effective import NOT_REPORTED, Setting
from moelab.study import ranking


def _settings(t: dict) -> list[Setting]:
    return [Setting.model_validate(s) for s in (t.get("effective") or {}).get("settings") or []]


def effective_table(trials: list[dict]) -> tuple[list[str], list[list[str]]]:
    """(the settings any launch asked for or reported, rows: trial, configuration, then per setting
    what ran, "asked X, ran Y" where the engine ran something else, or not reported)."""
    launched = [t for t in trials if t.get("effective") and t["status"] == "done" and t["stage"] != "reference"]
    names = [n for n in ("moe_runner", "fp4_gemm", "fp8_gemm", "attention", "quantization", "kv_cache_dtype",
                         "cuda_graph")
             if any(s.name == n and (s.ran or s.requested or s.refused) for t in launched for s in _settings(t))]
    rows = []
    for t in launched:
        by = {s.name: s for s in _settings(t)}
        cells = []
        for n in names:
            s = by.get(n)
            if s is None or s.status == "not reported":
                cells.append(f"asked {s.requested}; {NOT_REPORTED}" if s and s.requested else NOT_REPORTED)
            elif s.changed:
                cells.append(f"**{s.describe()}**")
            elif s.status == "resolved" and s.requested is not None:
                cells.append(s.describe())  # `auto: ran grouped`
            else:
                cells.append(s.ran)
        rows.append([str(t["id"]), t["label"], *cells])
    return names, rows


def changed_lines(trials: list[dict]) -> list[str]:
    """One sentence per launch whose engine replaced or refused a requested value, with the log line."""
    out = []
    for t in trials:
        if t["status"] != "done":
            continue
        for s in _settings(t):
            if s.changed:
                where = f" (server.log line {s.line}: `{(s.text or '').strip()[:140]}`)" if s.line else ""
                out.append(f"Trial {t['id']} `{t['label']}`: {s.name.replace('_', ' ')} {s.flag or ''}: "
                           f"{s.describe()}{where}.")
    return out


def merged_lines(configs: dict) -> list[str]:
    """Which requests ran the same configuration and are one entry in the ranking."""
    out = []
    for c in configs.values():
        if c.get("same_as"):
            others = ", ".join(f"`{x}`" for x in c["same_as"])
            out.append(f"`{c['label']}` stands for {others} too: the engine ran the same configuration for them, "
                       f"so they are one configuration in the ranking ({len(c['samples'])} measurements together).")
    return out


def _primary_of(configs: dict, trials: list[dict]) -> list[tuple[dict, dict, dict]]:
    by_id = {t["id"]: t for t in trials}
    out = []
    for c in configs.values():
        t = by_id.get(c.get("rep_trial") or c["trials"][-1])
        p = ranking.primary((t or {}).get("metrics"))
        if t is not None and p is not None:
            out.append((c, t, p))
    return out


def _ms(x) -> str:
    return "-" if x is None else f"{x:.1f}"


def server_table(configs: dict, trials: list[dict], engine: str | None = None) -> list[list[str]]:
    """Per configuration at its primary point: the client's TTFT beside the server's own, ITL, the
    server's queue and KV cache, preemptions, and what bound the point."""
    rows = []
    for c, t, p in _primary_of(configs, trials):
        w = p.get("server") or {}
        if not w.get("available"):
            rows.append([c["label"], str(p["concurrency"]), f"{_ms(p.get('ttft_mean_ms'))} / {_ms(p.get('ttft_p90_ms'))}",
                         f"- ({w.get('note') or 'not scraped'})", "-", "-", "-", "-", "-", "-"])
            continue
        tt, it = w.get("ttft_ms") or {}, w.get("itl_ms") or w.get("decode_step_ms") or {}
        kv, q, run = w.get("kv_usage"), w.get("waiting"), w.get("running")
        rows.append([c["label"], str(p["concurrency"]), f"{_ms(p.get('ttft_mean_ms'))} / {_ms(p.get('ttft_p90_ms'))}",
                     f"{_ms(tt.get('mean_ms'))} / ≤{_ms(tt.get('p90_ms'))}" if tt else "-",
                     f"{_ms(it.get('mean_ms'))}" if it else "-",
                     f"{run['mean']:.1f} / {run['peak']:.0f}" if run else "-",
                     f"{q['mean']:.1f} / {q['peak']:.0f}" if q else "-",
                     f"{kv['mean']:.0%} / {kv['peak']:.0%}" if kv else "-",
                     "-" if w.get("preemptions") is None else f"{w['preemptions']:.0f}",
                     {"kv_cache": "KV cache (no room for the next request)", "running": "running-request cap"}
                     .get(bound_of(w, running_limit(t, engine)), "-")])
    return rows


def running_limit(t: dict, engine: str | None) -> int | None:
    """The cap on running requests this trial's launch set (the engine's own flag), None where not set."""
    from moelab.engines import ENGINES

    try:
        flag = ENGINES.create(engine).running_limit_flag if engine else None
    except (KeyError, ValueError):
        flag = None
    v = (t.get("flags") or {}).get(flag) if flag else None
    try:
        return int(v) if v is not None else None
    except (TypeError, ValueError):
        return None


def bound_of(w: dict, cap: int | None) -> str | None:
    """What held the server at a point: "kv_cache" (full, or requests queued while fewer ran than the
    cap: the next request's KV reservation did not fit), "running" (queued at the cap, or the cap
    unknown), None (nothing queued)."""
    b = w.get("bound")
    run = (w.get("running") or {}).get("peak")
    if b == "running" and cap is not None and run is not None and run < cap and w.get("kv_usage"):
        return "kv_cache"
    return b


def capacity_lines(configs: dict, trials: list[dict], engine: str | None = None) -> list[str]:
    """Advice: a configuration whose server was full at the measured point is bounded by capacity,
    not by speed, and comparing its throughput with another's says little about their kernels.
    A server that queued requests with fewer running than its cap was held by KV room for the next
    request (an engine that reserves a request's whole length at admission shows a cache below 100%)."""
    out = []
    for c, t, p in _primary_of(configs, trials):
        w = p.get("server") or {}
        run, q, kv = w.get("running") or {}, w.get("waiting") or {}, w.get("kv_usage") or {}
        cap = running_limit(t, engine)
        at = f"at concurrency {p['concurrency']}"
        bound = bound_of(w, cap)
        if bound == "kv_cache":
            out.append(f"`{c['label']}` is capacity-bound {at}, not slow: the server queued up to "
                       f"{q.get('peak', 0):.0f} requests with at most {run.get('peak', 0):.0f} running"
                       + (f" of its {cap} slots" if cap is not None else "")
                       + f" and its KV cache {kv.get('peak', 0):.0%} reserved at the peak: the next request "
                       "did not fit. More KV room (a higher memory fraction, a smaller context, an fp8 KV cache) "
                       "admits more requests; its kernels are not what limits it here.")
        elif bound == "running":
            held = (f"its running-request cap ({cap})" if cap is not None
                    else "its admission limit (the running-request cap, or KV room for the next request)")
            out.append(f"`{c['label']}` ran at {held} {at}: at most {run.get('peak', 0):.0f} running, up to "
                       f"{q.get('peak', 0):.0f} queued, KV cache peak {kv.get('peak', 0):.0%}. Raise the cap to "
                       "measure it at this load; its throughput here is the cap's, not its kernels'.")
    for t in trials:
        for p in (t.get("metrics") or {}).get("points") or []:
            for f in p.get("findings") or []:
                if "client TTFT" in f or "other traffic" in f:
                    out.append(f"Trial {t['id']} `{t['label']}` {f}.")
    return out


def search_lines(trials: list[dict]) -> list[str]:
    """Per launch searched for its capacity under the SLO (objective max_concurrency_at_slo): each
    concurrency tried, in the order tried, met or broken and why; the capacity it found."""
    out = []
    for t in sorted(trials, key=lambda t: t["id"]):
        m = t.get("metrics") or {}
        for i, steps in enumerate(m.get("search") or []):
            tried = ", ".join(f"{st['concurrency']:g} " + ("met" if st["met"] else f"broke it ({'; '.join(st['why'])})")
                              for st in steps)
            got = ((m.get("objective") or {}).get("values") or [None] * (i + 1))[i]
            out.append(f"Trial {t['id']} `{t['label']}`" + (f" search {i + 1}" if len(m["search"]) > 1 else "")
                       + f": {tried}; capacity {'none' if not got else f'{got:g}'}.")
    return out


def spread_table(ranked: list[dict]) -> list[list[str]]:
    """Per ranked configuration: launches, the spread within a launch and across launches (CV), and
    what the interval is over."""
    def pct(x):
        return "-" if x is None else f"{x:.1%}"
    return [[c["label"], str(c.get("launches") or 0), str(len(c["samples"])), pct(c.get("within_cv")),
             pct(c.get("across_cv")), "launch means" if c.get("interval_over") == "launches" else "one launch's repeats"]
            for c in ranked]


def objective_line(rec: dict | None, study: dict) -> str:
    """Which objective decided the recommendation, in words."""
    obj = (study.get("spec") or {}).get("objective") or "throughput"
    conc = ((study.get("spec") or {}).get("workload") or {}).get("concurrency") or []
    at = f" at concurrency {conc[-1]}" if conc and obj != "max_concurrency_at_slo" else ""
    how = {"throughput": f"output tokens/s{at}, the SLOs a filter",
           "goodput": f"goodput{at}: requests/s whose every request met the SLO",
           "max_concurrency_at_slo": "the highest concurrency whose requests met the SLO at p90, searched on each "
                                     f"launch between concurrency {conc[0] if conc else 1} and {conc[-1] if conc else '?'}"}
    return f"Decided by the objective `{obj}`: {how[obj]}." if rec else ""


def _table(head: list[str], rows: list[list[str]]) -> list[str]:
    cell = lambda x: str(x).replace("|", "\\|").replace("\n", " ")  # noqa: E731
    return ["| " + " | ".join(head) + " |", "|" + "---|" * len(head),
            *("| " + " | ".join(cell(x) for x in r) + " |" for r in rows), ""]


SERVER_HEAD = ["configuration", "concurrency", "client TTFT mean / p90 ms", "server TTFT mean / p90 ms",
               "server ITL mean ms", "running mean / peak", "queued mean / peak", "KV cache mean / peak",
               "preempted", "bound by"]
SPREAD_HEAD = ["configuration", "launches", "n", "within a launch (CV)", "across launches (CV)", "interval over"]


def markdown(data: dict) -> list[str]:
    """The report's sections on what was measured (empty where a study has nothing to say)."""
    trials, configs = data["trials"], data["configs"]
    out: list[str] = []
    names, rows = effective_table(trials)
    if rows:
        out += ["## What each launch ran (the engine's own log)", "",
                f"Each setting as the engine reported it; **asked X, ran Y** where it ran something else; "
                f"\"{NOT_REPORTED}\" where its log does not say.", ""]
        out += _table(["#", "configuration", *[n.replace("_", " ") for n in names]], rows)
    notes = changed_lines(trials) + merged_lines(configs)
    if notes:
        out += [f"- {x}" for x in notes] + [""]
    srv = server_table(configs, trials, (data["study"].get("spec") or {}).get("engine"))
    if srv and all(r[4] == "-" and r[3].startswith("- (") for r in srv):  # no server exported any
        out += ["## The server's own metrics", "", f"None: {srv[0][3][3:-1]}.", ""]
    elif srv:
        out += ["## The server's own metrics at each configuration's primary point", "",
                "Client figures from moelab's load client; server figures from the engine's /metrics over the same "
                "window (a server percentile is the edge of its histogram bucket, an upper bound).", ""]
        out += _table(SERVER_HEAD, srv)
    cap = capacity_lines(configs, trials, (data["study"].get("spec") or {}).get("engine"))
    if cap:
        out += [f"- {x}" for x in cap] + [""]
    searched = search_lines(trials)
    if searched:
        out += ["## Capacity under the SLO, as searched", "",
                "Each launch doubled the concurrency until the SLO broke (at p90), then bisected; the highest "
                "concurrency that met it is the launch's capacity.", ""] + [f"- {x}" for x in searched] + [""]
    if any(c.get("launches", 0) > 1 for c in data["ranked"]):
        out += ["## Spread within and across launches", "",
                "Finalists run again in separate launches: the interval is over launch means where there are "
                "several, so it covers boot-to-boot variance, not only repeats on one server.", ""]
        out += _table(SPREAD_HEAD, spread_table(data["ranked"]))
    return out


def html(data: dict) -> str:
    """The same sections as HTML tables."""
    def table(head, rows):
        import re

        fmt = lambda x: re.sub(r"\*\*(.*?)\*\*", r"<b>\1</b>", escape(str(x)))  # noqa: E731
        return ("<table><tr>" + "".join(f"<th>{escape(h)}</th>" for h in head) + "</tr>"
                + "".join("<tr>" + "".join(f"<td>{fmt(x)}</td>" for x in r) + "</tr>" for r in rows) + "</table>")

    trials, configs = data["trials"], data["configs"]
    out = ""
    names, rows = effective_table(trials)
    if rows:
        out += ("<h2>What each launch ran (the engine's own log)</h2>"
                + table(["#", "configuration", *[n.replace("_", " ") for n in names]], rows))
    notes = changed_lines(trials) + merged_lines(configs)
    if notes:
        out += "<ul>" + "".join(f"<li>{escape(x.replace('`', ''))}</li>" for x in notes) + "</ul>"
    srv = server_table(configs, trials, (data["study"].get("spec") or {}).get("engine"))
    if srv:
        out += "<h2>The server's own metrics at each configuration's primary point</h2>" + table(SERVER_HEAD, srv)
    cap = capacity_lines(configs, trials, (data["study"].get("spec") or {}).get("engine"))
    if cap:
        out += "<ul>" + "".join(f"<li>{escape(x.replace('`', ''))}</li>" for x in cap) + "</ul>"
    searched = search_lines(trials)
    if searched:
        out += ("<h2>Capacity under the SLO, as searched</h2><ul>"
                + "".join(f"<li>{escape(x.replace('`', ''))}</li>" for x in searched) + "</ul>")
    if any(c.get("launches", 0) > 1 for c in data["ranked"]):
        out += "<h2>Spread within and across launches</h2>" + table(SPREAD_HEAD, spread_table(data["ranked"]))
    return out
