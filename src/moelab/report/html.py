"""The HTML report: one self-contained file (inline CSS and SVG, no scripts, nothing fetched).

Order: the recommended launch command, the verdict matrix coloured by cause, the throughput-
latency plot with its Pareto front, the working configurations with their intervals, then every
trial with its evidence, advice and repro command (collapsed, so the page stays short).
"""
from __future__ import annotations

import re
from html import escape

from moelab.report import measured
from moelab.report.build import COLOURS, failures_text
from moelab.report.svg import tradeoff
from moelab.study.ranking import OBJECTIVES, interval_text, objective_text, primary, tie_sentence

CSS = """li.budget{color:#b00;font-weight:bold}

body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;color:#1d2330;margin:0;background:#f4f5f7}
main{max-width:1080px;margin:0 auto;padding:24px 28px 60px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:30px 0 10px;border-bottom:1px solid #dde;padding-bottom:4px}
.muted{color:#667}.card{background:#fff;border:1px solid #dde1e6;border-radius:8px;padding:14px 18px;margin:12px 0}
.rec{border-left:6px solid #2e9d5b}.rec.none{border-left-color:#d23c3c}.big{font-size:18px;font-weight:600}
pre{background:#1d2330;color:#e8eaf0;padding:10px 12px;border-radius:6px;overflow-x:auto;font-size:12.5px;margin:8px 0}
table{border-collapse:collapse;background:#fff;font-size:13px}th,td{border:1px solid #dde1e6;padding:5px 9px;text-align:left}
th{background:#eef0f4;font-weight:600}td.num{text-align:right;font-variant-numeric:tabular-nums}
.matrix td{color:#fff;font-weight:600;text-align:center;min-width:120px}.matrix td small{display:block;font-weight:400;opacity:.9}
.matrix td.pruned{background-image:repeating-linear-gradient(45deg,rgba(255,255,255,.18) 0 6px,transparent 6px 12px)}
.badge{display:inline-block;padding:1px 8px;border-radius:10px;color:#fff;font-size:12px;font-weight:600}
.legend span{margin-right:10px;white-space:nowrap}.tie{color:#9a6b00;font-weight:600}
details{background:#fff;border:1px solid #dde1e6;border-radius:6px;margin:6px 0;padding:6px 12px}
summary{cursor:pointer}summary b{display:inline-block;min-width:34px}ul.ev{margin:6px 0 6px 18px;padding:0}
ul.ev li{margin:2px 0}code{font-size:12.5px}.kv{color:#556;font-size:12.5px}
"""


def _badge(cause: str | None, status: str = "done") -> str:
    c = cause or "unknown"
    extra = f" <span class='muted'>({escape(status)})</span>" if status not in ("done",) else ""
    return f"<span class='badge' style='background:{COLOURS.get(c, '#999')}'>{escape(c)}</span>{extra}"


def _rec(rec: dict | None, slo: dict) -> str:
    if not rec:
        return ("<div class='card rec none'><div class='big'>No configuration worked under the SLOs.</div>"
                "<p>Every trial's verdict and evidence is listed below.</p></div>")
    tie = ""
    if rec["tie"]:
        tie = f"<p class='tie'>{escape(tie_sentence(rec).replace('`', ''))}</p>"
    elif rec.get("runner_up"):
        r = rec["runner_up"]
        tie = f"<p class='muted'>Runner-up: {escape(r['label'])}, {r['output_tps']:.1f} tok/s ({interval_text(r)}).</p>"
    if rec.get("measured_once"):
        tie += "<p class='tie'>Measured once: no interval yet. Measure it again before trusting it.</p>"
    if rec.get("accuracy") is not None:
        tie += f"<p class='muted'>Task accuracy of the pick: {rec['accuracy']:.1%} (the study's accuracy gate).</p>"
    for g in rec.get("faster_below_accuracy_gate") or []:
        tie += (f"<p class='tie'>Not recommended although faster: {escape(g['label'])} {g['output_tps']:.1f} tok/s: "
                f"{escape(g['why'])}.</p>")
    slos = ", ".join(f"{k} &le; {v:g}" for k, v in slo.items() if v is not None)
    return (f"<div class='card rec'><div class='muted'>Recommended launch command</div>"
            f"<div class='big'>{escape(rec['label'])}: {escape(objective_text(rec))} "
            f"<span class='muted' style='font-weight:400'>({interval_text(rec)})</span></div>"
            f"<pre>{escape(rec['command'])}</pre>{tie}"
            + (f"<div class='muted'>SLOs (p90): {slos}</div>" if slos else "") + "</div>")


def _bisect(b: dict | None) -> str:
    from moelab.report.markdown import bisect_md

    if not b:
        return ""
    text = escape(" ".join(bisect_md(b))).replace("**Bisect:**", "<b>Bisect:</b>")
    body = re.sub(r"`([^`]*)`", r"<code>\1</code>", text)
    return f"<div class='card' style='border-left:6px solid #d23c3c'>{body}</div>"


def _search(lines: list[str]) -> str:
    if not lines:
        return ""
    items = "".join(("<li class='budget'>" if x.startswith("STOPPED") else "<li>") + escape(x) + "</li>" for x in lines)
    return f"<h2>How the study searched</h2><ul class='search'>{items}</ul>"


def _matrix(m: dict | None) -> str:
    if not m:
        return ""
    head = "".join(f"<th>{escape(c)}</th>" for c in m["cols"])
    rows = []
    for r in m["rows"]:
        tds = []
        for c in m["cols"]:
            x = m["cells"].get(f"{r}|{c}")
            if not x:
                tds.append("<td style='background:#cfd3da;color:#556'>not run</td>")
                continue
            sub = [f"trial {x['trial']}"] + (["pruned"] if x["status"] == "pruned" else []) + \
                  (["reused"] if x["status"] == "reused" else []) + \
                  ([f"{x['tps']:.0f} tok/s"] if x.get("tps") is not None else []) + \
                  ([f"{x['ok']}/{x['n']} ok"] if x.get("n", 1) > 1 else [])
            also = ""
            if x["cause"] == "ok" and x.get("failures"):  # never hide a failure behind a cell that worked
                worst = sorted(x["failures"])[0]
                also = (f"<small class='also' style='border-left:6px solid {COLOURS.get(worst, '#999')}'>also "
                        f"{escape(failures_text(x))}</small>")
            tds.append(f"<td class='{escape(x['status'])}' style='background:{COLOURS.get(x['cause'] or '', '#999')}'>"
                       f"{escape(x['cause'] or '?')}<small>{escape(', '.join(sub))}</small>{also}</td>")
        rows.append(f"<tr><th>{escape(r)}</th>{''.join(tds)}</tr>")
    corner = f"{escape(m['rows_axis'])} &darr; / {escape(m['cols_axis'] or '')} &rarr;"
    note = (f"<p class='note'>Each cell: the best of its trials over {escape(', '.join(m['others']))}, and every "
            "failure among them.</p>") if m.get("others") else ""
    return (f"<h2>Verdicts: {escape(m['rows_axis'])} &times; {escape(m['cols_axis'] or '')}</h2>"
            f"<table class='matrix'><tr><th>{corner}</th>{head}</tr>{''.join(rows)}</table>{note}")


def _gated(configs: dict) -> str:
    rows = []
    for c in sorted(configs.values(), key=lambda c: -c["mean"]):
        why = "; ".join(f for f in c["slo_failures"] if f.startswith("below the accuracy gate"))
        if why:
            rows.append(f"<tr><td>{escape(c['label'])}</td><td class='num'>{c['mean']:.1f}</td>"
                        f"<td class='num'>{c.get('accuracy', 0):.1%}</td><td>{escape(why)}</td></tr>")
    if not rows:
        return ""
    return ("<h2>Below the accuracy gate (never recommended)</h2><table><tr><th>configuration</th>"
            "<th>output tok/s</th><th>accuracy</th><th>why</th></tr>" + "".join(rows) + "</table>")


def _ranked(ranked: list[dict], picked: str | None = None, objective: str = "throughput") -> str:
    if not ranked:
        return ""
    hi = max(c["high"] for c in ranked) or 1
    rows = []
    for c in ranked:
        lo_x, hi_x, m_x = 200 * c["low"] / hi, 200 * c["high"] / hi, 200 * c["mean"] / hi
        bar = (f"<svg width='210' height='14'><line x1='{lo_x:.1f}' y1='7' x2='{hi_x:.1f}' y2='7' stroke='#2e9d5b' "
               f"stroke-width='4'/><circle cx='{m_x:.1f}' cy='7' r='4' fill='#1d2330'/></svg>")
        ci = f"{c['low']:.1f}-{c['high']:.1f}" if len(c["samples"]) > 1 else "measured once"
        mark = " <b>(recommended)</b>" if c["label"] == picked else ""
        acc = f"{c['accuracy']:.1%}" if c.get("accuracy") is not None else "-"
        rows.append(f"<tr><td>{escape(c['label'])}{mark}</td><td class='num'>{c['mean']:.1f}</td>"
                    f"<td class='num'>{ci}</td><td class='num'>{len(c['samples'])}</td>"
                    f"<td class='num'>{acc}</td><td>{bar}</td></tr>")
    unit = OBJECTIVES[objective]
    order = "fastest first" if objective == "throughput" else f"best first by {unit}"
    return (f"<h2>Configurations that work, {escape(order)}</h2><table><tr><th>configuration</th><th>{escape(unit)}</th>"
            "<th>95% CI</th><th>n</th><th>accuracy</th><th>interval</th></tr>" + "".join(rows) + "</table>")


def _server_head() -> str:
    return "<th>server TTFT mean ms</th><th>running peak</th><th>queued peak</th><th>KV cache peak</th>"


def _server_cells(w: dict | None) -> str:
    """The server's own figures beside the client's, per load point (blank where none were scraped)."""
    if not w or not w.get("available"):
        return f"<td colspan='4' class='muted'>{escape((w or {}).get('note') or 'no server metrics')}</td>"
    g = lambda k, f: f(w[k]["peak"]) if w.get(k) else "-"  # noqa: E731
    tt = w.get("ttft_ms")
    return (f"<td class='num'>{tt['mean_ms']:.1f}</td>" if tt else "<td>-</td>") + \
        f"<td class='num'>{g('running', lambda x: f'{x:.0f}')}</td><td class='num'>{g('waiting', lambda x: f'{x:.0f}')}</td>" \
        f"<td class='num'>{g('kv_usage', lambda x: f'{x:.0%}')}</td>"


def _trial(t: dict) -> str:
    v = t.get("verdict") or {}
    p = primary(t.get("metrics"))
    tps = f" &middot; {p['output_tps']:.1f} tok/s" if p and p.get("output_tps") is not None else ""
    ev = "".join(f"<li><span class='kv'>{escape(e['kind'])}{' line ' + str(e['line']) if e.get('line') else ''}"
                 f"{' &middot; ' + escape(e['source']) if e.get('source') else ''}:</span> <code>{escape(e['text'])}</code></li>"
                 for e in v.get("evidence") or [])
    paths = t.get("paths") or {}
    repro = f"<div class='kv'>repro: <code>sh {escape(paths['repro'])}</code></div>" if paths.get("repro") else ""
    logs = f"<div class='kv'>log: <code>{escape(paths['log'])}</code></div>" if paths.get("log") else ""
    cmd = t.get("command") or t.get("args") or []
    pts = (t.get("metrics") or {}).get("points") or []
    load = ""
    if pts:
        load = ("<table><tr><th>concurrency</th><th>output tok/s</th><th>TTFT p90 ms</th><th>TPOT p50 ms</th>"
                "<th>E2E p90 ms</th><th>valid</th>" + _server_head() + "</tr>" + "".join(
                    f"<tr><td class='num'>{q['concurrency']}</td><td class='num'>{q['output_tps']:.1f}</td>"
                    f"<td class='num'>{(q.get('ttft_p90_ms') or 0):.0f}</td><td class='num'>{(q.get('tpot_p50_ms') or 0):.1f}</td>"
                    f"<td class='num'>{(q.get('e2e_p90_ms') or 0):.0f}</td><td>{'yes' if q.get('valid') else 'no: ' + escape('; '.join(q.get('invalid_reasons') or []))}</td>"
                    + _server_cells(q.get("server")) + "</tr>"
                    for q in pts) + "</table>")
    return (f"<details><summary><b>#{t['id']}</b> {escape(t['stage'])}{' #' + str(t['rep']) if t['rep'] else ''} "
            f"&middot; {escape(t['label'])} &middot; {_badge(t['cause'], t['status'])} "
            f"<span class='muted'>{escape(v.get('phase') or '')}{tps}</span></summary>"
            f"<ul class='ev'>{ev or '<li>ready, probe passed</li>'}</ul>"
            + (f"<p><b>Advice:</b> {escape(v['advice'])}</p>" if v.get("advice") else "")
            + (f"<pre>{escape(' '.join(cmd))}</pre>" if cmd else "") + repro + logs + load + "</details>")


def render(data: dict) -> str:
    s = data["study"]
    fp = s.get("fingerprint") or {}
    env = " &middot; ".join(f"{escape(k)} {escape(str(v))}" for k, v in fp.items() if v not in (None, "", 0))
    causes = "".join(f"<span>{_badge(k)} {n}</span>" for k, n in sorted(data["causes"].items(), key=lambda kv: -kv[1]))
    trials = "".join(_trial(t) for t in sorted(data["trials"], key=lambda t: t["id"]))
    return (f"<!doctype html><html lang='en'><head><meta charset='utf-8'><meta name='viewport' "
            f"content='width=device-width, initial-scale=1'><title>moelab study: {escape(s['name'])}</title>"
            f"<style>{CSS}</style></head><body><main>"
            f"<h1>moelab study: {escape(s['name'])}</h1><div class='muted'>strategy {escape(s['spec']['strategy'])} "
            f"&middot; engine {escape(s['spec']['engine'])} &middot; {len(data['trials'])} trials &middot; "
            f"status {escape(s['status'])}</div><div class='muted'>{env}</div>"
            + ("" if s["spec"].get("strategy") == "bisect" else _rec(data["recommendation"], data["slo"])) + _bisect((s.get("extra") or {}).get("bisect"))
            + f"<div class='legend'>{causes}</div>" + _search(data.get("search") or []) + _matrix(data["matrix"])
            + "<h2>Throughput and latency</h2><div class='card'>" + tradeoff(data["curves"], data["pareto"]) + "</div>"
            + _ranked(data["ranked"], (data["recommendation"] or {}).get("label"), data.get("objective") or "throughput") + _gated(data["configs"])
            + (f"<p class='muted'>{escape(measured.objective_line(data['recommendation'], s).replace('`', ''))}</p>"
               if data["recommendation"] else "") + measured.html(data)
            + f"<h2>Trials</h2>{trials}</main></body></html>\n")
