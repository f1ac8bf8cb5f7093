"""`GET /metrics` in the Prometheus text format (0.0.4), written here so scorer envs need no client
library.

Counters: requests by endpoint and status, items scored, errors by kind, residency transitions.
A histogram of score latency (the scorer's own time, and the whole request). Gauges read at
scrape time: requests in flight, connections waiting, residency state, resident memory, and
CUDA memory when the scorer has torch with CUDA initialised.
"""

from __future__ import annotations

import os
import sys
import threading
from bisect import bisect_left
from collections import Counter
from collections.abc import Callable, Iterable

PREFIX = "managed_scorers_child"
LATENCY_BUCKETS_S = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    300.0,
)
RESIDENCY_STATES = ("resident", "offloaded", "unknown")
Labels = tuple[tuple[str, str], ...]
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
ENDPOINTS = frozenset(
    {
        "/health",
        "/metrics",
        "/score",
        "/onload",
        "/offload",
        "/drain",
        "/shutdown",
        "/openrlhf",
        "/unirl/health",
        "/unirl/score",
    }
)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(pairs: Iterable[tuple[str, str]]) -> str:
    text = ",".join(f'{key}="{_escape(value)}"' for key, value in pairs)
    return "{" + text + "}" if text else ""


class Histogram:
    def __init__(self, buckets: tuple[float, ...] = LATENCY_BUCKETS_S) -> None:
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)  # the last one is +Inf
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.buckets, value)] += 1
        self.total += value

    def lines(self, name: str, labels: tuple[tuple[str, str], ...]) -> list[str]:
        out, running = [], 0
        for bound, count in zip((*map(repr, self.buckets), "+Inf"), self.counts, strict=True):
            running += count
            out.append(f"{name}_bucket{_labels((*labels, ('le', bound)))} {running}")
        out.append(f"{name}_sum{_labels(labels)} {self.total!r}")
        out.append(f"{name}_count{_labels(labels)} {running}")
        return out


class ChildMetrics:
    """Counted by the app as requests pass; rendered on scrape. Thread-safe (the scorer runs in a
    worker)."""

    def __init__(self, scorer: str, rank: int = 0) -> None:
        self.scorer = scorer
        self.rank = rank  # the owning trainer rank: with `scorer`, on every series
        self._lock = threading.Lock()
        self.requests: Counter[tuple[str, int]] = Counter()
        self.errors: Counter[str] = Counter()
        self.items = 0
        self.score_latency = Histogram()
        self.request_latency = Histogram()

    def request(self, endpoint: str, status: int, seconds: float) -> None:
        # a scanner's made-up paths must not grow the label set without bound
        if endpoint not in ENDPOINTS:
            endpoint = "other"
        with self._lock:
            self.requests[(endpoint, status)] += 1
            if endpoint == "/score":
                self.request_latency.observe(seconds)

    def error(self, kind: str) -> None:
        with self._lock:
            self.errors[kind] += 1

    def scored(self, items: int, seconds: float) -> None:
        with self._lock:
            self.items += items
            self.score_latency.observe(seconds)

    def render(
        self,
        in_flight: int,
        pending_connections: int | None,
        residency: str,
        transitions: Counter[str],
        rss_bytes: Callable[[], int | None] = lambda: resident_bytes(),
    ) -> str:
        scorer = (("scorer", self.scorer), ("rank", str(self.rank)))
        lines: list[str] = []
        with self._lock:
            self._counted(lines, scorer)
        _load_gauges(lines, scorer, in_flight, pending_connections)
        _residency(lines, scorer, residency, transitions)
        _memory_gauges(lines, scorer, rss_bytes())
        return "\n".join(lines) + "\n"

    def _counted(self, lines: list[str], scorer: Labels) -> None:
        """The counters and histograms; the caller holds the lock, so they agree with each other."""
        name = _family(
            lines, "requests_total", "counter", "HTTP requests answered, by endpoint and status."
        )
        for (endpoint, status), count in sorted(self.requests.items()):
            lines.append(
                f"{name}{_labels((*scorer, ('endpoint', endpoint), ('status', str(status))))} "
                f"{count}"
            )
        name = _family(lines, "items_total", "counter", "Items scored.")
        lines.append(f"{name}{_labels(scorer)} {self.items}")
        name = _family(
            lines, "errors_total", "counter", "Requests answered with an error, by kind."
        )
        for kind, count in sorted(self.errors.items()):
            lines.append(f"{name}{_labels((*scorer, ('kind', kind)))} {count}")
        name = _family(
            lines,
            "score_seconds",
            "histogram",
            "The scorer's time per request (decode and encode aside).",
        )
        lines.extend(self.score_latency.lines(name, scorer))
        name = _family(
            lines, "request_seconds", "histogram", "Whole /score requests, body read to answer."
        )
        lines.extend(self.request_latency.lines(name, scorer))


def _family(lines: list[str], name: str, kind: str, help_text: str) -> str:
    """Opens a family with its HELP and TYPE lines; its full name, which its samples carry."""
    full = f"{PREFIX}_{name}"
    lines.extend((f"# HELP {full} {help_text}", f"# TYPE {full} {kind}"))
    return full


def _load_gauges(
    lines: list[str], scorer: Labels, in_flight: int, pending_connections: int | None
) -> None:
    """Requests in flight, and connections waiting (where the child has a connection gate)."""
    name = _family(lines, "in_flight", "gauge", "Score requests accepted and not yet answered.")
    lines.append(f"{name}{_labels(scorer)} {in_flight}")
    if pending_connections is not None:
        name = _family(
            lines, "pending_connections", "gauge", "Connections waiting for their first request."
        )
        lines.append(f"{name}{_labels(scorer)} {pending_connections}")


def _residency(lines: list[str], scorer: Labels, residency: str, transitions: Counter[str]) -> None:
    """The residency state, one series per state (1 for the current one), and its changes."""
    name = _family(lines, "residency", "gauge", "1 for the scorer's current residency state.")
    for state in RESIDENCY_STATES:
        lines.append(f"{name}{_labels((*scorer, ('state', state)))} {int(state == residency)}")
    name = _family(
        lines, "residency_transitions_total", "counter", "Residency changes, by the state reached."
    )
    for state, count in sorted(transitions.items()):
        lines.append(f"{name}{_labels((*scorer, ('to', state)))} {count}")


def _memory_gauges(lines: list[str], scorer: Labels, rss: int | None) -> None:
    """Resident memory (left out where it cannot be read), and CUDA memory where torch uses it."""
    if rss is not None:
        name = _family(
            lines, "resident_memory_bytes", "gauge", "Resident set size of the child process."
        )
        lines.append(f"{name}{_labels(scorer)} {rss}")
    for metric, value in cuda_memory().items():
        name = _family(
            lines,
            f"cuda_{metric}_bytes",
            "gauge",
            f"torch.cuda.memory_{metric}() on the scorer's device.",
        )
        lines.append(f"{name}{_labels(scorer)} {value}")


def resident_bytes() -> int | None:
    try:
        with open("/proc/self/statm") as handle:
            return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None  # not Linux: the gauge is left out, never reported as 0


def cuda_memory() -> dict[str, int]:
    """Only when the scorer already uses torch with CUDA: a scrape never initialises CUDA itself."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return {}
    return {
        "allocated": int(torch.cuda.memory_allocated()),
        "reserved": int(torch.cuda.memory_reserved()),
    }
