"""The Markdown report: reads well in a terminal and in a pull request. Recommendation first."""
from __future__ import annotations

from moelab.study.stats import primary


def _cell(t: str) -> str:
    return t.replace("|", "\\|").replace("\n", " ")


def recommendation_md(rec: dict | None, slo: dict) -> list[str]:
    if not rec:
        return ["**No configuration worked under the SLOs.** Every trial's verdict is below.", ""]
    lines = [f"**Recommended:** `{rec['label']}` at **{rec['output_tps']:.1f} output tok/s** "
             f"(95% CI {rec['ci95'][0]:.1f}-{rec['ci95'][1]:.1f}, n={rec['n']})", ""]
    if rec["tie"]:
        lines += ["Statistically tied with: " + "; ".join(
            f"`{t['label']}` {t['output_tps']:.1f} tok/s (CI {t['ci95'][0]:.1f}-{t['ci95'][1]:.1f})" for t in rec["tie"])
            + ". The intervals overlap, so this is a tie, not a win; the pick is the one with the fewest changes "
              "from the baseline.", ""]
    elif rec.get("runner_up"):
        r = rec["runner_up"]
        lines += [f"Runner-up: `{r['label']}` {r['output_tps']:.1f} tok/s (CI {r['ci95'][0]:.1f}-{r['ci95'][1]:.1f}).", ""]
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
    out += bisect_md((s.get("extra") or {}).get("bisect"))
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
                cells.append(f"{x['cause']}{tag}{tps}")
            out.append("| " + " | ".join([r, *cells]) + " |")
        out.append("")
    if data["ranked"]:
        out += ["## Configurations that work, fastest first", "",
                "| configuration | output tok/s | 95% CI | n |", "|---|---:|---|---:|"]
        for c in data["ranked"]:
            out.append(f"| {_cell(c['label'])} | {c['mean']:.1f} | {c['low']:.1f}-{c['high']:.1f} | {len(c['samples'])} |")
        out.append("")
    if data["pareto"]:
        out += ["Pareto front (throughput vs p90 latency): " + "; ".join(
            f"{p['label']} @ concurrency {p['concurrency']}: {p['output_tps']:.0f} tok/s, {p['e2e_p90_ms']:.0f} ms"
            for p in data["pareto"]), ""]
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
