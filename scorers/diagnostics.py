"""Diagnostics: reporting only, never part of a reward, and mergeable across chunks, terms and
ranks.

A scorer reports declared names, each a count (a number; counts add up), a mean carried as
`{"sum": s, "count": n}` (sums and counts add up; the mean is taken at the end), or one of the
tail's kinds (`scorers.tail`: a latency histogram, the slowest items by id).
A report is `{"sample_count": n, "values": {...}}`; metrics are named
`<namespace>/reward/<term>/<diagnostic>`. Stdlib only.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from typing import Any

from scorers import tail

NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")


class DiagnosticsError(ValueError):
    """A diagnostic that is undeclared, not a count or mean, or not finite."""


def mean(total: float, count: int) -> dict[str, float | int]:
    """A mean as it travels: a scorer reports `mean(sum_of_values, number_of_values)`."""
    return {"sum": float(total), "count": int(count)}


def check_name(name: str, what: str) -> str:
    if not isinstance(name, str) or not NAME.match(name):
        raise DiagnosticsError(
            f"{what} {name!r} must match {NAME.pattern} (it is a metric path segment)"
        )
    return name


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def check_values(scorer: str, declared: Iterable[str], values: Any) -> dict[str, Any]:
    """Every name declared, every value a finite count or a (sum, count) mean."""
    if not isinstance(values, Mapping):
        raise DiagnosticsError(
            f"scorer {scorer!r} diagnostics must be a mapping, got {type(values).__name__}"
        )
    allowed = set(declared)
    checked: dict[str, Any] = {}
    for name, value in values.items():
        if name not in allowed:
            raise DiagnosticsError(
                f"scorer {scorer!r} reported undeclared diagnostic {name!r} (declared: "
                f"{sorted(allowed)})"
            )
        if _finite(value):
            checked[name] = value
        elif tail.kind(value) is not None:
            try:
                checked[name] = tail.checked(value)
            except tail.TailError as exc:
                raise DiagnosticsError(f"scorer {scorer!r} diagnostic {name!r}: {exc}") from exc
        elif (
            isinstance(value, Mapping)
            and set(value) == {"sum", "count"}
            and _finite(value["sum"])
            and isinstance(value["count"], int)
            and not isinstance(value["count"], bool)
            and value["count"] >= 0
        ):
            checked[name] = {"sum": float(value["sum"]), "count": value["count"]}
        else:
            raise DiagnosticsError(
                f"scorer {scorer!r} diagnostic {name!r} = {value!r}: expected a finite count or "
                "{'sum': finite, 'count': int >= 0} (use scorers.diagnostics.mean), or a "
                "scorers.tail histogram or top list"
            )
    return checked


def merge_values(parts: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    merged: dict[str, Any] = {}
    for part in parts:
        for name, value in part.items():
            if name not in merged:
                merged[name] = dict(value) if isinstance(value, Mapping) else value
            elif _kind(value) != _kind(merged[name]):
                raise DiagnosticsError(
                    f"diagnostic {name!r} is a {_kind(merged[name])} in one report and a "
                    f"{_kind(value)} in another"
                )
            elif tail.kind(value) is not None:
                try:
                    merged[name] = tail.merged(merged[name], value)
                except tail.TailError as exc:
                    raise DiagnosticsError(f"diagnostic {name!r}: {exc}") from exc
            elif isinstance(value, Mapping):
                merged[name] = {
                    "sum": merged[name]["sum"] + value["sum"],
                    "count": merged[name]["count"] + value["count"],
                }
            else:
                merged[name] = merged[name] + value
    return merged


def _kind(value: Any) -> str:
    if isinstance(value, Mapping):
        return tail.kind(value) or "mean"
    return "count"


def report(sample_count: int, values: Mapping[str, Any]) -> dict[str, Any]:
    return {"sample_count": int(sample_count), "values": dict(values)}


def merge_reports(reports: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Reports of one term from several chunks or ranks: sample counts and values add up."""
    reports = list(reports)
    return report(
        sum(r["sample_count"] for r in reports), merge_values(r["values"] for r in reports)
    )


def merge_term_reports(
    parts: Iterable[Mapping[str, Mapping[str, Any]]],
) -> dict[str, dict[str, Any]]:
    """`{term: report}` mappings (one per chunk, rank or response) merged term by term."""
    by_term: dict[str, list[Mapping[str, Any]]] = {}
    for part in parts:
        for term, rep in part.items():
            by_term.setdefault(term, []).append(rep)
    return {term: merge_reports(reps) for term, reps in by_term.items()}


def to_metrics(
    reports: Mapping[str, Mapping[str, Any]], namespace: str = "train"
) -> dict[str, float]:
    """Flat metrics for a logger: counts as they are, means resolved (a mean of nothing is left
    out), a histogram as its count and quantiles, a top list as its largest value."""
    if namespace not in ("train", "val"):
        raise DiagnosticsError(f"namespace must be 'train' or 'val', got {namespace!r}")
    metrics: dict[str, float] = {}
    for term, rep in reports.items():
        prefix = f"{namespace}/reward/{check_name(term, 'term')}"
        metrics[f"{prefix}/sample_count"] = float(rep["sample_count"])
        for name, value in rep["values"].items():
            if tail.kind(value) is not None:
                metrics.update(tail.metrics(f"{prefix}/{name}", value))
            elif isinstance(value, Mapping):
                if value["count"]:
                    metrics[f"{prefix}/{name}"] = value["sum"] / value["count"]
            else:
                metrics[f"{prefix}/{name}"] = float(value)
    return metrics
