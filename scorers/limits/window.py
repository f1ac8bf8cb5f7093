"""The adaptive in-flight window of one endpoint (AIMD), kept in the node's shared `Levels`.

The rule, per answer:

- throttled (a 429 or 503) or a latency spike (over `SPIKE` x the base latency): the window is
  halved (`CUT`), at least 1, at most once per base latency (at least `MIN_CUT_GAP_S`), so one burst
  of refusals halves it once, as TCP does once per round trip;
- otherwise: it grows by `ADD / window`, so one window's worth of good answers adds `ADD`, never
  above the declared `concurrency`;
- any other failure (a 500, a refused connection) leaves it as it is.

The base latency is the lowest recent answer time: a faster answer lowers it at once, a slower one
raises it by `FOLLOW` of the gap, so an endpoint that is slower for good is followed within some
tens of answers. A Retry-After pauses the whole endpoint (`Levels.pause`). Stdlib only.
"""

from __future__ import annotations

from scorers.limits.bucket import Levels

ADD = 1.0
CUT = 0.5
SPIKE = 2.0
FOLLOW = 0.05
MIN_CUT_GAP_S = 0.05


def answered(levels: Levels, ceiling: int, latency_s: float, now: float) -> None:
    """A good answer in `latency_s`: grow, or halve on a spike."""
    spike = levels.base_s > 0 and latency_s > SPIKE * levels.base_s
    if levels.base_s == 0 or latency_s < levels.base_s:
        levels.base_s = latency_s
    else:
        levels.base_s += (latency_s - levels.base_s) * FOLLOW
    if spike:
        cut(levels, now)
    else:
        levels.window = min(float(ceiling), levels.window + ADD / max(levels.window, 1.0))


def cut(levels: Levels, now: float) -> None:
    """A 429, a 503 or a spike: halve the window, once per base latency."""
    if now - levels.cut_at >= max(levels.base_s, MIN_CUT_GAP_S):
        levels.window = max(1.0, levels.window * CUT)
        levels.cut_at = now


def usable(levels: Levels) -> int:
    """How many slots the window lets calls take now."""
    return max(1, int(levels.window))
