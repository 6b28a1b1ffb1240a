"""The audit as lines of text: one matrix row per backend with gates, the deciding code under it.

    --moe-runner-backend         sm_80  sm_89  sm_90  sm_100 sm_103 sm_120 sm_121
      hpc_ops                    x      x      ok     x      x      x      x
          sglang/srt/layers/moe/moe_runner/runner.py:155  --moe-runner-backend hpc_ops requires an SM90 ...
"""
from __future__ import annotations

from moelab.audit.matrix import ALLOWED, NO_GATE, REFUSED, Audit, Cell

MARK = {ALLOWED: "ok", NO_GATE: "-"}
LEGEND = ("x refused   x? refused under conditions   ok allowed   ok* allowed, refused under conditions   "
          "- no gate found   (conditions: `when` in --json)")


def mark(c: Cell) -> str:
    if c.status == REFUSED:
        return "x" if c.unconditional else "x?"
    return MARK[c.status] + ("*" if c.when else "")


def lines(a: Audit) -> list[str]:
    pk = ", ".join(f"{p.dist or p.name} {p.version or '?'}" for p in a.packages)
    gated = {(f.flag, f.value) for f in a.findings}
    out = [f"audit     {a.engine} {a.version} read with {a.python}",
           f"packages  {pk}" + (f"; not installed there: {', '.join(a.missing)}" if a.missing else ""),
           f"choices   {a.choices_from}",
           f"read      {a.files_parsed:,} files in {a.seconds:.1f} s; {len(a.findings)} gates for "
           f"{len(gated)} of {len(a.rows)} backend choices",
           *([f"reused    the audit read at {a.read_at or '?'}: no file of it has changed since "
              f"({a.reused_from}); --fresh reads the source again"] if a.reused_from else []),
           f"          {LEGEND}", ""]
    for flag in dict.fromkeys(r.flag for r in a.rows):
        frows = [r for r in a.rows if r.flag == flag]
        out.append(f"{flag:<29}" + " ".join(f"{arch:<6}" for arch in a.archs))
        for r in frows:
            cells = [r.cells[arch] for arch in a.archs]
            if all(c.status == NO_GATE for c in cells):
                continue
            out.append(f"  {r.value:<27}" + " ".join(f"{mark(c):<6}" for c in cells))
            for at in dict.fromkeys(c.at for c in cells if c.at):
                c = next(c for c in cells if c.at == at)
                out.append(f"      {at}  {(c.message or '')[:110]}")
        none = [r.value for r in frows if all(c.status == NO_GATE for c in r.cells.values())]
        if none:
            out.append(f"  no gate found: {', '.join(none)}")
        out.append("")
    if a.drift:
        out.append(f"drift     the source against engines/support_matrix.yaml ({len(a.drift)}; the matrix rows "
                   f"carry no engine version, the source is {a.engine} {a.version})")
        for d in a.drift:
            out.append(f"  ! {d.flag} {d.value} on {d.arch} ({', '.join(d.formats)}): matrix says {d.matrix} "
                       f"[{d.matrix_source}]; source {d.source} it at {d.at}"
                       + (f" ({d.message[:90]})" if d.message else "")
                       + (f"; still refused under conditions at {', '.join(w.split(': ')[0] for w in d.when)}"
                          if d.when else ""))
    else:
        out.append("drift     none: where the source decides, it agrees with engines/support_matrix.yaml")
    return out


BY = {"launches": "launches here decide", "source": "the installed source refuses it",
      "curated": "from the curated matrix", "none": "nothing known"}


def knowledge_lines(items) -> list[str]:
    """`moelab check`'s three kinds of knowledge per backend choice (audit.knowledge.Knowledge)."""
    out = []
    for k in items:
        c, s, ln = k.curated, k.source, k.launches
        out.append(f"knowledge {k.flag} {k.backend} on {k.arch} ({k.format}): {k.decision} ({BY[k.decided_by]})")
        out.append(f"            curated   {c.status}" + (f": {c.note}" if c.note else "")
                   + (f" [{c.source}]" if c.source else ""))
        if s is None:
            out.append(f"            source    {k.source_of}")
        else:
            word = s.status if s.unconditional else "refused under conditions"
            out.append(f"            source    {word}" + (f" at {s.at}" if s.at else "")
                       + (f": {s.message[:120]}" if s.message else "") + f" [{k.source_of}]")
            for w in s.when[:3]:
                out.append(f"                      when {w[:160]}")
        if ln.status == "none":
            out.append("            launches  none on this arch" + (f" in {ln.store}" if ln.store else " (no store)"))
        else:
            parts = [f"ok in trial {', '.join(map(str, ln.ok))}"] if ln.ok else []
            parts += [f"{cause} in trial {', '.join(map(str, ids))}" for cause, ids in ln.failed.items()]
            out.append(f"            launches  {ln.status}: {'; '.join(parts)} [{ln.store}]")
        for d in k.disagreements:
            out.append(f"          ! {d}")
    return out
