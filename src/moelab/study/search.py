"""Few-launch search of one numeric knob on its grid: pure, deterministic, feasibility-aware.

A launch costs minutes on a real GPU box, so a knob gets a handful of them. The search keeps
what every launch taught: scores of the points that ran, and points that failed to launch (a
memory fraction with no room, a graph size past the GPU's memory). It assumes the score is
unimodal over the points that launch and that the points that fail lie beyond a boundary at one
end or both. Each step probes the middle of the widest unexplored gap beside the best point, on
the side that is still open, so it brackets the optimum or the feasibility edge in about log2(n)
launches. After the first probe it also knows whether the knob matters at all at this load.

    >>> grid = [0.5, 0.6, 0.7, 0.8, 0.9]
    >>> next_value(grid, {0.7: 100.0})            # both sides open: the far end first
    0.9
    >>> next_value(grid, {0.7: 100.0, 0.9: None})  # it failed: the other end
    0.5
    >>> next_value(grid, {0.7: 100.0, 0.9: None, 0.5: 80.0})  # bracketed: between best and the edge
    0.8
"""
from __future__ import annotations

from moelab.study.file import Range

FLAT = 0.03  # a knob whose two first points differ by less than this share does nothing at this load


def grid(rg: Range) -> list:
    """The knob's points: every step (rounded to the step, so 0.57 and not 0.5700000000000001)."""
    return rg.values()


def snap(rg: Range, v) -> object:
    """The grid point nearest to `v` (a base value off the grid searches from its nearest point)."""
    pts = grid(rg)
    return min(pts, key=lambda p: (abs(float(p) - float(v)), p))


def next_value(points: list, history: dict) -> object | None:
    """The next point to launch, or None when the best point's neighbours on the grid are known.

    `history` maps tried points to their score (higher is better) or None (the launch failed)."""
    tried = [i for i, p in enumerate(points) if p in history]
    ok = [i for i in tried if history[points[i]] is not None]
    if not ok:
        untried = [i for i in range(len(points)) if points[i] not in history]
        if not untried:
            return None
        failed = tried
        # no feasible point yet: the middle of the widest gap of untried points
        return points[_middle_of_widest(untried, failed, len(points))]
    best = max(ok, key=lambda i: (history[points[i]], -abs(i - len(points) // 2)))
    lo = max((i for i in tried if i < best), default=-1)
    hi = min((i for i in tried if i > best), default=len(points))
    gaps = []
    if best - lo > 1:
        gaps.append((best - lo, (lo + best) // 2 if lo >= 0 else _toward_end(best, 0)))
    if hi - best > 1:
        gaps.append((hi - best, (best + hi + 1) // 2 if hi < len(points) else _toward_end(best, len(points) - 1)))
    if not gaps:
        return None
    return points[max(gaps)[1]]


def _toward_end(best: int, end: int) -> int:
    """A first probe toward an open end goes all the way: an edge is often where the optimum is."""
    return end


def _middle_of_widest(untried: list[int], failed: list[int], n: int) -> int:
    edges = sorted([-1, *failed, n])
    spans = [(b - a, (a + b) // 2) for a, b in zip(edges, edges[1:]) if b - a > 1]
    return max(spans)[1] if spans else untried[0]


def matters(history: dict) -> bool | None:
    """Whether the knob changes the score at this load: None until two points launched."""
    scores = [s for s in history.values() if s is not None]
    if len(scores) < 2:
        return None
    return (max(scores) - min(scores)) / max(max(scores), 1e-9) >= FLAT
