"""The tail's two diagnostic kinds (`scorers.diagnostics`): a latency histogram and the slowest
items by name. Both merge across chunks, terms and ranks as counts and means do, so a step's
report says how its slowest calls went and which items they were. Stdlib only.

- `histogram(seconds)` -> `{"bounds": [...], "counts": [...]}`: `counts[i]` values at most
  `bounds[i]` (and above the bound before), the last count those above every bound. Histograms of
  one name must share their bounds to merge.
- `slowest(pairs)` -> `{"top": [[id, seconds], ...], "k": k}`: the k largest, largest first.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Mapping
from typing import Any

# seconds: from a fast local rule to a judge call past a minute
LATENCY_BOUNDS_S = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
TOP_K = 5
QUANTILES = {"p50": 0.5, "p95": 0.95, "p99": 0.99}
HISTOGRAM, TOP = frozenset({"bounds", "counts"}), frozenset({"top", "k"})


class TailError(ValueError):
    """A histogram or top list that is malformed, or two that cannot merge."""


def histogram(seconds: Iterable[float], bounds: tuple[float, ...] = LATENCY_BOUNDS_S) -> dict:
    counts = [0] * (len(bounds) + 1)
    for value in seconds:
        counts[bisect.bisect_left(bounds, value)] += 1
    return {"bounds": list(bounds), "counts": counts}


def slowest(pairs: Iterable[tuple[str, float]], k: int = TOP_K) -> dict:
    ranked = sorted(((str(i), float(s)) for i, s in pairs), key=lambda pair: -pair[1])
    return {"top": [[i, s] for i, s in ranked[:k]], "k": k}


def kind(value: Any) -> str | None:
    """ "histogram" or "top" for a value of either shape, else None."""
    if isinstance(value, Mapping) and set(value) in (HISTOGRAM, TOP):
        return "histogram" if set(value) == HISTOGRAM else "top"
    return None


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def checked(value: Mapping[str, Any]) -> dict:
    """A plain copy of a well-formed histogram or top list; TailError says what is wrong."""
    if kind(value) == "histogram":
        bounds, counts = value["bounds"], value["counts"]
        if not (
            isinstance(bounds, list)
            and bounds
            and all(_finite(b) for b in bounds)
            and all(a < b for a, b in zip(bounds, bounds[1:], strict=False))
            and isinstance(counts, list)
            and len(counts) == len(bounds) + 1
            and all(_count(c) for c in counts)
        ):
            raise TailError("a histogram needs increasing finite bounds and one count more")
        return {"bounds": [float(b) for b in bounds], "counts": list(counts)}
    top, k = value["top"], value["k"]
    if not (
        _count(k)
        and k >= 1
        and isinstance(top, list)
        and len(top) <= k
        and all(
            isinstance(pair, list)
            and len(pair) == 2
            and isinstance(pair[0], str)
            and _finite(pair[1])
            for pair in top
        )
    ):
        raise TailError("a top list needs k >= 1 and at most k [id, finite seconds] pairs")
    return {"top": [[i, float(s)] for i, s in top], "k": k}


def merged(a: Mapping[str, Any], b: Mapping[str, Any]) -> dict:
    """Two values of one kind as one: counts added (same bounds), or the k largest of both."""
    if kind(a) != kind(b):
        raise TailError("a histogram and a top list cannot merge")
    if kind(a) == "histogram":
        if list(a["bounds"]) != list(b["bounds"]):
            raise TailError("histograms with other bounds cannot merge")
        return {
            "bounds": list(a["bounds"]),
            "counts": [x + y for x, y in zip(a["counts"], b["counts"], strict=True)],
        }
    return slowest([*a["top"], *b["top"]], max(a["k"], b["k"]))


def _bucket(counts: list[int], q: float) -> int:
    """The bucket the q-quantile falls in (the last: past every bound)."""
    seen, rank = 0, q * sum(counts)
    for index, count in enumerate(counts):
        seen += count
        if seen >= rank:
            return index
    return len(counts) - 1


def metrics(name: str, value: Mapping[str, Any]) -> dict[str, float]:
    """A histogram as its count and quantiles (each the upper bound of the bucket it falls in; in
    the last bucket, the last bound: a value past every bound is at least that), a top list as
    its largest value. Nothing for an empty one."""
    if kind(value) == "top":
        return {f"{name}/max": float(value["top"][0][1])} if value["top"] else {}
    counts, bounds = value["counts"], value["bounds"]
    if not sum(counts):
        return {}
    found = {f"{name}/count": float(sum(counts))}
    for label, q in QUANTILES.items():
        found[f"{name}/{label}"] = float(bounds[min(_bucket(counts, q), len(bounds) - 1)])
    return found


def describe(name: str, value: Mapping[str, Any]) -> str:
    """One line for a person (the `score` CLI's summary)."""
    if kind(value) == "top":
        named = ", ".join(f"{i} {s:.3g} s" for i, s in value["top"])
        return f"{name}: {named or 'none'}"
    counts, bounds = value["counts"], value["bounds"]
    if not sum(counts):
        return f"{name}: no calls"
    parts = []
    for label, q in QUANTILES.items():
        index = _bucket(counts, q)
        past = index == len(bounds)
        parts.append(f"{label} {'>' if past else '<='} {bounds[index - 1 if past else index]:g} s")
    return f"{name}: {', '.join(parts)} over {sum(counts)}"
