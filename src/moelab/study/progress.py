"""The study's progress display on stderr: one line per finished trial, a live status line on a TTY.

It consumes the runner's events (start / progress / done / pruned / reused / resumed / blamed), so the
runner knows nothing about terminals. Colours follow the report's: green ok, red failed, grey pruned.
"""
from __future__ import annotations

import time

from rich.console import Console
from rich.markup import escape

ICON = {"done": "", "pruned": "pruned before launch", "reused": "reused from the store",
        "resumed": "already done in this study, not rerun"}


class Progress:
    def __init__(self, console: Console | None = None) -> None:
        self.console = console or Console(stderr=True, highlight=False)
        self.status = None
        self.n = 0
        self.cur: dict = {}
        self.t0 = time.monotonic()

    def __enter__(self) -> "Progress":
        if self.console.is_terminal:
            self.status = self.console.status("starting the study ...")
            self.status.start()
        return self

    def __exit__(self, *exc) -> None:
        if self.status:
            self.status.stop()

    def __call__(self, e: dict) -> None:
        kind = e["event"]
        if kind == "start":
            self.cur = {**e, "t": time.monotonic()}
            self._status(escape(f"trial {e['id']} [{e['stage']}] {clip(e['label'], 70)}: launching"))
        elif kind == "progress":
            if self.cur.get("id") == e.get("id"):
                phase = e.get("phase") or "launch"
                rss = e.get("rss_bytes")
                mem = f", {rss / 2**20:.0f} MiB" if rss else ""
                self._status(escape(f"trial {e['id']} [{self.cur['stage']}] {clip(self.cur['label'], 70)}: {phase} "
                                    f"{time.monotonic() - self.cur['t']:.0f}s{mem}"))
        elif kind == "blamed":
            self.console.print(escape(f"    -> {e['flag']} {e['value']} is pruned from now on ({e['cause']}): {e['why']}"),
                               style="dim", highlight=False, soft_wrap=True)
        elif kind != "again":  # a trial this run already printed, asked for again: not a new line
            self._line(kind, e["trial"])

    def _status(self, text: str) -> None:
        if self.status:
            self.status.update(f"[bold]{text}[/]  [dim](study {time.monotonic() - self.t0:.0f}s)[/]")

    def _line(self, kind: str, t: dict) -> None:
        self.n += 1
        cause = t.get("cause") or "?"
        colour = "green" if cause == "ok" else ("grey50" if kind in ("pruned", "reused", "resumed") else "red")
        from moelab.study.ranking import primary

        p = primary(t.get("metrics"))
        tps = f"  {p['output_tps']:.1f} tok/s" if p and p.get("output_tps") is not None else ""
        why = ""
        if cause != "ok":
            ev = (t.get("verdict") or {}).get("evidence") or []
            why = f"  [dim]{escape(clip(ev[0]['text'], 110))}[/]" if ev else ""
        note = f" [dim]({ICON[kind]})[/]" if ICON.get(kind) else ""
        self.console.print(f"{t['id']:>3} {t['stage']:<9} {escape(t['label']):<64} [{colour}]{cause}[/]{tps}{note}{why}",
                           markup=True, highlight=False, soft_wrap=True)


def clip(text: str, n: int) -> str:
    """At most n characters, cut at a word boundary with an ellipsis (never mid-word)."""
    text = " ".join(text.split())
    if len(text) <= n:
        return text
    cut = text[:n - 1].rsplit(" ", 1)[0]
    return (cut if len(cut) > n // 2 else text[:n - 1]) + "…"
