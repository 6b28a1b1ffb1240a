"""How a verdict is shown: a Rich panel for people, one JSON document for programs.

`moelab launch` and `moelab diagnose` share both, so their JSON has the same top level:
cause, phase, evidence, advice (then detail and whatever the command adds).
"""
from __future__ import annotations

import json

from moelab.spec import Cause, Verdict

_COLOUR = {Cause.ok: "green", Cause.unknown: "yellow"}


def verdict_doc(v: Verdict, **extra) -> dict:
    doc = v.model_dump(mode="json")
    return {"cause": doc["cause"], "phase": doc["phase"], "evidence": doc["evidence"], "advice": doc["advice"],
            "confidence": doc["confidence"], "alternatives": doc["alternatives"], "detail": doc["detail"], **extra}


def verdict_json(v: Verdict, mask=lambda s: s, **extra) -> str:
    return mask(json.dumps(verdict_doc(v, **extra), indent=2, default=str))


def verdict_panel(v: Verdict, log_name: str = "log", footer: list[str] | None = None, mask=lambda s: s):
    """A Rich renderable: cause and phase, evidence with log line numbers, advice, footer lines. Print
    it with `soft_wrap=False`: a panel has a width, and the console's soft wrap for pipes would crop
    every line at its border (the advice cut mid-word in a file) instead of wrapping it."""
    from rich.panel import Panel
    from rich.text import Text

    colour = _COLOUR.get(v.cause, "red")
    body = Text()
    body.append(f"{v.cause.value}", style=f"bold {colour}")
    body.append(f"  in phase {v.phase.value}\n")
    for e in v.evidence:
        where = f"{log_name}:{e.line}" if e.line else e.kind
        body.append(f"  {where:<16} ", style="cyan")
        text = e.text if len(e.text) <= 300 else e.text[:299] + "…"
        body.append(mask(text) + "\n")
    if v.confidence is not None or v.alternatives:
        conf = f"confidence {v.confidence:.2f}" if v.confidence is not None else ""
        alts = ", ".join(f"{a.cause.value} {a.confidence:.2f}" for a in v.alternatives)
        body.append(f"  {conf}" + (f"; second readings: {alts}" if alts else "") + "\n", style="dim")
    if v.advice:
        body.append("\nadvice: ", style="bold")
        body.append(mask(v.advice) + "\n")
    for line in footer or []:
        body.append(mask(line) + "\n", style="dim")
    body.rstrip()
    return Panel(body, title="moelab verdict", border_style=colour, expand=False)
