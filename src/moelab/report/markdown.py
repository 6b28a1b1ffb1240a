"""The Markdown report: reads well in a terminal and in a pull request. Recommendation first."""
from __future__ import annotations

from moelab.report import measured
from moelab.report.build import failures_text
from moelab.study.ranking import OBJECTIVES, interval_text, objective_text, primary, tie_sentence


def _cell(t: str) -> str:
    return t.replace("|", "\\|").replace("\n", " ")


def recommendation_md(rec: dict | None, slo: dict) -> list[str]:
    if not rec:
        return ["**No configuration worked under the SLOs.** Every trial's verdict is below.", ""]
    lines = [f"**Recommended:** `{rec['label']}` at **{objective_text(rec)}** ({interval_text(rec)})", ""]
    if rec.get("measured_once"):
        lines += ["No configuration was measured more than once, so this pick has no interval: measure it again "
                  "(`--rerun`, or more finalist repeats) before trusting it.", ""]
    if rec["tie"]:
        lines += [tie_sentence(rec), ""]
    elif rec.get("runner_up"):
        r = rec["runner_up"]
        lines += [f"Runner-up: `{r['label']}` {r['output_tps']:.1f} tok/s ({interval_text(r)}).", ""]
    if rec.get("accuracy") is not None:
        lines += [f"Task accuracy of the pick: {rec['accuracy']:.1%} (the study's accuracy gate).", ""]
    for g in rec.get("faster_below_accuracy_gate") or []:
        lines += [f"Not recommended although faster: `{g['label']}` {g['output_tps']:.1f} tok/s: {g['why']}.", ""]
    for u in rec.get("unrepeated_faster") or []:
        lines += [f"Not recommended although faster once: `{u['label']}` {u['output_tps']:.1f} tok/s (measured once; "
                  "a single measurement is not repeated evidence).", ""]
    lines += ["```sh", rec["command"], "```", ""]
    if any(v is not None for v in slo.values()):
        lines += ["SLOs (p90): " + ", ".join(f"{k} <= {v:g}" for k, v in slo.items() if v is not None), ""]
    return lines


def bisect_md(b: dict | None) -> list[str]:
    if not b:
        return []
    if not b.get("reproduced"):
        return [f"**Bisect:** {b.get('note', '')}", ""]
    alone = ", ".join(f"`{k}` {c}" for k, c in b["alone"].items())
    return [f"**Bisect:** `{b['cause']}` needs all of `{' '.join(f'{k} {v}' for k, v in b['minimal'])}` "
            f"(trial {b['minimal_trial']}). Each change alone: {alone}."
            + (" The changes interact: they are not independent." if b["interaction"] else ""), ""]


def render(data: dict) -> str:
    s, rec = data["study"], data["recommendation"]
    fp = s.get("fingerprint") or {}
    env = ", ".join(f"{k} {v}" for k, v in fp.items() if v not in (None, "", 0))
    out = [f"# moelab study: {s['name']}", "",
           f"Strategy `{s['spec']['strategy']}`, engine `{s['spec']['engine']}`, {len(data['trials'])} trials "
           f"({', '.join(f'{k} {v}' for k, v in sorted(data['causes'].items(), key=lambda kv: -kv[1]))}). "
           f"Status: {s['status']}.", ""]
    if s["spec"].get("strategy") != "bisect":
        out += recommendation_md(rec, data["slo"])
        if rec:
            out += [measured.objective_line(rec, s), ""]
    out += bisect_md((s.get("extra") or {}).get("bisect"))
    if data.get("search"):
        out += ["## How the study searched", ""] + [f"- {_cell(x)}" for x in data["search"]] + [""]
    m = data["matrix"]
    if m:
        out += [f"## Verdicts: {m['rows_axis']} x {m['cols_axis'] or ''}".rstrip(), "",
                "| " + " | ".join([m["rows_axis"], *m["cols"]]) + " |", "|" + "---|" * (len(m["cols"]) + 1)]
        for r in m["rows"]:
            cells = []
            for c in m["cols"]:
                x = m["cells"].get(f"{r}|{c}")
                if not x:
                    cells.append("-")
                    continue
                tag = " (pruned)" if x["status"] == "pruned" else " (reused)" if x["status"] == "reused" else ""
                tps = f" {x['tps']:.0f} tok/s" if x.get("tps") is not None else ""
                also = f"; also {failures_text(x)}" if x["cause"] == "ok" and x.get("failures") else ""
                n = f" [{x['ok']}/{x['n']} ok]" if x.get("n", 1) > 1 else ""
                cells.append(_cell(f"{x['cause']}{tag}{tps}{n}{also}"))
            out.append("| " + " | ".join([r, *cells]) + " |")
        if m.get("others"):
            out.append(f"\nEach cell: the best of its trials over {', '.join(m['others'])}, "
                       "and every failure among them.")
        out.append("")
    if data["ranked"]:
        acc = any(c.get("accuracy") is not None for c in data["configs"].values())
        unit = OBJECTIVES[data.get("objective") or "throughput"]
        out += ["## Configurations that work, " + ("fastest first" if unit == OBJECTIVES["throughput"]
                                                    else f"best first by {unit}"), "",
                f"| configuration | {unit} | 95% CI | n |" + (" accuracy |" if acc else ""),
                "|---|---:|---|---:|" + ("---:|" if acc else "")]
        picked = rec["label"] if rec else None
        for c in data["ranked"]:
            ci = f"{c['low']:.1f}-{c['high']:.1f}" if len(c["samples"]) > 1 else "measured once"
            mark = " **(recommended)**" if c["label"] == picked else ""
            a = (f" {c['accuracy']:.1%} |" if c.get("accuracy") is not None else " - |") if acc else ""
            out.append(f"| {_cell(c['label'])}{mark} | {c['mean']:.1f} | {ci} | {len(c['samples'])} |{a}")
        out.append("")
    gated = [c for c in data["configs"].values() if any(f.startswith("below the accuracy gate")
                                                          for f in c["slo_failures"])]
    if gated:
        out += ["## Below the accuracy gate (never recommended)", "",
                "| configuration | output tok/s | accuracy | why |", "|---|---:|---:|---|"]
        for c in sorted(gated, key=lambda c: -c["mean"]):
            why = "; ".join(f for f in c["slo_failures"] if f.startswith("below the accuracy gate"))
            out.append(f"| {_cell(c['label'])} | {c['mean']:.1f} | {c.get('accuracy', 0):.1%} | {_cell(why)} |")
        out.append("")
    if data["pareto"]:
        out += ["Pareto front (throughput vs p90 latency): " + "; ".join(
            f"{p['label']} @ concurrency {p['concurrency']}: {p['output_tps']:.0f} tok/s, {p['e2e_p90_ms']:.0f} ms"
            for p in data["pareto"]), ""]
    out += measured.markdown(data)
    out += ["## Trials", "", "| # | stage | configuration | verdict | phase | tok/s | why |", "|---:|---|---|---|---|---:|---|"]
    order = sorted(data["trials"], key=lambda t: t["id"])
    for t in order:
        p = primary(t.get("metrics"))
        ev = ((t.get("verdict") or {}).get("evidence") or [])
        why = _cell(ev[0]["text"][:110]) if ev and t["cause"] != "ok" else ""
        status = "" if t["status"] == "done" else f" ({t['status']})"
        tps = f"{p['output_tps']:.1f}" if p and p.get("output_tps") is not None else ""
        out.append(f"| {t['id']} | {t['stage']} | {_cell(t['label'])} | {t['cause'] or '-'}{status} | "
                   f"{t['phase'] or '-'} | {tps} | {why} |")
    out += ["", f"Environment: {env}.", "",
            "Every launched trial has a folder with server.log, telemetry.jsonl, verdict.json and repro.sh; "
            "`moelab report STORE --html FILE` shows each trial's evidence and repro command.", ""]
    return "\n".join(out)
