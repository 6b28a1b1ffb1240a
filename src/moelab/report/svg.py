"""Inline SVG plots, generated here: no JavaScript, no fonts or scripts from the network.

`tradeoff` draws throughput (x, output tok/s) against p90 end-to-end latency (y, ms): one line per
configuration through its load points (concurrency rising), and the Pareto front dashed on top.
"""
from __future__ import annotations

import math
from html import escape

PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#7f7f7f",
           "#d62728"]


def _ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """Round tick values covering [lo, hi]."""
    if hi <= lo:
        hi = lo + 1
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    start = math.floor(lo / step) * step
    return [round(start + i * step, 10) for i in range(int((hi - start) / step) + 2)]


def _fmt(v: float) -> str:
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:g}"


def tradeoff(curves: list[dict], pareto: list[dict], width: int = 1000, height: int = 400) -> str:
    pts = [p for c in curves for p in c["points"] if p.get("output_tps") is not None and p.get("e2e_p90_ms") is not None]
    if not pts:
        return '<p class="muted">No configuration was benchmarked, so there is no throughput-latency plot.</p>'
    ml, mr, mt, mb = 64, 330, 16, 46  # margins; the legend sits on the right
    pw, ph = width - ml - mr, height - mt - mb
    xt = _ticks(0, max(p["output_tps"] for p in pts) * 1.05)
    yt = _ticks(0, max(p["e2e_p90_ms"] for p in pts) * 1.08)
    x0, x1, y0, y1 = xt[0], xt[-1], yt[0], yt[-1]

    def X(v):
        return ml + (v - x0) / (x1 - x0) * pw

    def Y(v):
        return mt + ph - (v - y0) / (y1 - y0) * ph

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" width="{width}" height="{height}" '
           f'role="img" aria-label="throughput versus latency" font-family="system-ui, sans-serif" font-size="11">',
           f'<rect x="{ml}" y="{mt}" width="{pw}" height="{ph}" fill="#fafafa" stroke="#ccc"/>']
    for v in xt:
        out.append(f'<line x1="{X(v):.1f}" y1="{mt}" x2="{X(v):.1f}" y2="{mt + ph}" stroke="#e6e6e6"/>'
                   f'<text x="{X(v):.1f}" y="{mt + ph + 15}" text-anchor="middle" fill="#555">{_fmt(v)}</text>')
    for v in yt:
        out.append(f'<line x1="{ml}" y1="{Y(v):.1f}" x2="{ml + pw}" y2="{Y(v):.1f}" stroke="#e6e6e6"/>'
                   f'<text x="{ml - 6}" y="{Y(v) + 4:.1f}" text-anchor="end" fill="#555">{_fmt(v)}</text>')
    out.append(f'<text x="{ml + pw / 2}" y="{height - 8}" text-anchor="middle" fill="#222">output tokens/s</text>'
               f'<text transform="translate(14 {mt + ph / 2}) rotate(-90)" text-anchor="middle" fill="#222">'
               f'p90 end-to-end latency (ms)</text>')
    for i, c in enumerate(curves):
        col = PALETTE[i % len(PALETTE)]
        # past the palette, colours repeat: the later curves are dashed so no two look alike
        dash = f' stroke-dasharray="{6 - i // len(PALETTE)} 3"' if i >= len(PALETTE) else ""
        cp = [p for p in c["points"] if p.get("output_tps") is not None and p.get("e2e_p90_ms") is not None]
        if len(cp) > 1:
            d = " ".join(f"{X(p['output_tps']):.1f},{Y(p['e2e_p90_ms']):.1f}" for p in cp)
            out.append(f'<polyline points="{d}" fill="none" stroke="{col}" stroke-width="1.8"{dash}/>')
        for p in cp:
            out.append(f'<circle cx="{X(p["output_tps"]):.1f}" cy="{Y(p["e2e_p90_ms"]):.1f}" r="3.5" fill="{col}">'
                       f'<title>{escape(c["label"])}: concurrency {p["concurrency"]}, {p["output_tps"]:.1f} tok/s, '
                       f'p90 {p["e2e_p90_ms"]:.0f} ms</title></circle>')
        ly = mt + 10 + i * 16
        if ly < height - 30:
            swatch = (f'<line x1="{ml + pw + 12}" y1="{ly - 2}" x2="{ml + pw + 26}" y2="{ly - 2}" stroke="{col}" '
                      f'stroke-width="2.5"{dash}/>' if dash else
                      f'<rect x="{ml + pw + 14}" y="{ly - 7}" width="10" height="10" fill="{col}"/>')
            out.append(swatch + f'<text x="{ml + pw + 30}" y="{ly + 2}" fill="#222">{escape(c["label"][:48])}</text>')
    if pareto:
        d = " ".join(f"{X(p['output_tps']):.1f},{Y(p['e2e_p90_ms']):.1f}" for p in pareto)
        out.append(f'<polyline points="{d}" fill="none" stroke="#111" stroke-width="1.2" stroke-dasharray="5 4"/>')
        for p in pareto:
            out.append(f'<circle cx="{X(p["output_tps"]):.1f}" cy="{Y(p["e2e_p90_ms"]):.1f}" r="6" fill="none" '
                       f'stroke="#111" stroke-width="1.2"/>')
        ly = mt + 10 + len(curves) * 16 + 6
        out.append(f'<line x1="{ml + pw + 12}" y1="{ly - 2}" x2="{ml + pw + 26}" y2="{ly - 2}" stroke="#111" '
                   f'stroke-dasharray="4 3"/><text x="{ml + pw + 30}" y="{ly + 2}" fill="#222">Pareto front</text>')
    out.append("</svg>")
    return "\n".join(out)
