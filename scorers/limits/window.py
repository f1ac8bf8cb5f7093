"""The adaptive in-flight window of one endpoint (AIMD with CUBIC's plateau), kept in the node's
shared `Levels`.

It starts at 4 (at most `concurrency`) and, until its first cut, grows by `ADD` per good answer
(slow start: it doubles each round trip while it is used). Then, per answer:

- throttled (a 429 or 503) or a latency spike (over `SPIKE` x the base latency): the window is cut
  to `CUT` of itself (0.7, CUBIC's beta), at least 1, at most once per base latency (at least
  `MIN_CUT_GAP_S`), so one burst of refusals cuts it once, as TCP does once per round trip. The
  window it had is remembered as the `ceiling`. A refused probe (a refusal near the ceiling after
  `QUIET` base latencies without a cut) steps back by `STEP_BACK` instead (never past the cut);
- otherwise: it grows by `ADD / window`, so one window's worth of good answers adds `ADD`, never
  above the declared `concurrency`. Within `NEAR` (10 %) of the ceiling it grows `PROBE` times
  slower: it stays near the load last refused and probes past it rarely (a probe past capacity
  costs a 429). Past that band it grows at the full rate again (capacity grew);
- it grows only while it is used: an answer grows it only if some caller found every slot of the
  window held within the last `RECENT` base latencies (at least `MIN_RECENT_S`), as TCP validates
  its window (RFC 7661). Callers that back off after their 429s leave it unused, and a window
  that grew meanwhile would send them all into the next 429;
- any other failure (a 500, a refused connection) leaves it as it is.

Calls in flight when the window shrinks are never stopped, and they count: no call begins while
as many slots are held as the window allows, wherever they are (`Slots.try_take_counted`).

On the bench's endpoint (hidden capacity 12), halving without the plateau, the validation and the
count reached 94 % of the best fixed setting with 212 refusals in two runs; this rule reaches
97-98 % with 19-21 (bench/README.md, "endpoint_adaptive").

The base latency is the lowest recent answer time: a faster answer lowers it at once, a slower one
raises it by `FOLLOW` of the gap, so an endpoint that is slower for good is followed within some
tens of answers. A Retry-After pauses the whole endpoint (`Levels.pause`). Stdlib only.
"""

from __future__ import annotations

from scorers.limits.bucket import Levels

ADD = 1.0
CUT = 0.7
NEAR = 0.1  # windows within this fraction of the ceiling grow PROBE times slower
PROBE = 8.0
STEP_BACK = 1.0  # a refused probe's cut (never deeper than CUT's)
RECENT = 4.0
MIN_RECENT_S = 0.1
SPIKE = 2.0
FOLLOW = 0.05
MIN_CUT_GAP_S = 0.05
QUIET = 4.0  # base latencies without a cut before a refusal near the ceiling is a probe's


def answered(levels: Levels, ceiling: int, latency_s: float, now: float) -> None:
    """A good answer in `latency_s`: grow, or halve on a spike."""
    spike = levels.base_s > 0 and latency_s > SPIKE * levels.base_s
    if levels.base_s == 0 or latency_s < levels.base_s:
        levels.base_s = latency_s
    else:
        levels.base_s += (latency_s - levels.base_s) * FOLLOW
    if spike:
        cut(levels, now)
        return
    if now - levels.full_at > max(RECENT * levels.base_s, MIN_RECENT_S):
        return  # the window was not all used lately: nothing says more would be taken
    step = ADD if not levels.ceiling else ADD / max(levels.window, 1.0)  # slow start until a cut
    if levels.ceiling and _near_ceiling(levels, NEAR * levels.ceiling):
        step /= PROBE
    levels.window = min(float(ceiling), levels.window + step)


def cut(levels: Levels, now: float) -> None:
    """A 429, a 503 or a spike: cut the window, once per base latency; remember where. A probe
    refused (near the ceiling, after a quiet spell) steps back by one; any other refusal cuts."""
    gap = max(levels.base_s, MIN_CUT_GAP_S)
    if now - levels.cut_at < gap:
        return
    before = levels.window
    near = _near_ceiling(levels, max(NEAR * levels.ceiling, STEP_BACK))
    probe = bool(levels.ceiling) and near and now - levels.cut_at > QUIET * gap
    levels.window = max(1.0, max(before - STEP_BACK, before * CUT) if probe else before * CUT)
    levels.ceiling, levels.cut_at = before, now


def _near_ceiling(levels: Levels, band: float) -> bool:
    """The window within `band` of the window it was last cut from."""
    return abs(levels.window - levels.ceiling) <= band


def filled(levels: Levels, now: float) -> None:
    """A caller found every slot of the window held: the window is in use."""
    levels.full_at = now


def usable(levels: Levels) -> int:
    """How many slots the window lets calls take now."""
    return max(1, int(levels.window))
