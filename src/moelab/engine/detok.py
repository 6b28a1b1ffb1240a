"""Incremental text for one sequence: UTF-8 completion and stop strings, without leaking a stop.

Text is re-decoded from all output ids (a byte-level token may be half a character), and a tail
that could still grow into a stop string is held back until it either completes the stop or
cannot. On a stop the text ends right before it, like OpenAI's `stop`.
"""
from __future__ import annotations


class TextStream:
    def __init__(self, tokenizer, stop: tuple[str, ...]) -> None:
        self.tok, self.stop = tokenizer, tuple(s for s in stop if s)
        self.emitted = 0  # characters of the decoded text already handed out
        self.text = ""  # everything handed out so far
        self._k, self._prefix = 0, ""  # decode(ids[:_k]) == _prefix, cut at a character boundary

    def push(self, ids: list[int], final: bool) -> tuple[str, bool]:
        """All output ids so far -> (new text to hand out, whether a stop string was hit)."""
        tail = self.tok.decode(ids[self._k:])  # only the ids since the last clean boundary
        full = self._prefix + tail
        if not tail.endswith("\ufffd"):
            self._k, self._prefix = len(ids), full
        hit = [(i, s) for s in self.stop if (i := full.find(s, self.emitted)) >= 0]
        if hit:
            end = min(hit)[0]
            return self._out(full[self.emitted:end]), True
        end = len(full)
        if not final:
            while end > self.emitted and full[end - 1] == "\ufffd":  # maybe an incomplete UTF-8 sequence
                end -= 1
            end -= self._partial_stop(full[self.emitted:end])
        return self._out(full[self.emitted:end]), False

    def _partial_stop(self, tail: str) -> int:
        """Length of the longest suffix of `tail` that is a proper prefix of some stop string."""
        best = 0
        for s in self.stop:
            for k in range(min(len(s) - 1, len(tail)), best, -1):
                if tail.endswith(s[:k]):
                    best = k
                    break
        return best

    def _out(self, delta: str) -> str:
        self.emitted += len(delta)
        self.text += delta
        return delta
