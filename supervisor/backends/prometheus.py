"""Parent-side metrics for Prometheus, where the trainer env has prometheus-client.

`register()` adds one collector that reads every live managed backend's own counters at
scrape time: restarts, timeouts, and request bytes by transport path (in-band, copied into the
shared segment, sent in place from an arena). Nothing runs on the scoring path and nothing is
kept for a backend once it is gone. The children's own figures are on their `GET /metrics`.
"""

from __future__ import annotations

import itertools
import threading
import weakref
from collections.abc import Iterator, Mapping
from typing import Any, Protocol

from scorers import install
from supervisor.child import ranks
from supervisor.errors import ConfigError


class Counted(Protocol):
    """What the collector reads of a backend (a managed one today): its own counters."""

    metrics_id: str
    timeouts: int

    @property
    def restarts(self) -> int: ...

    @property
    def scorer_name(self) -> str: ...

    def transport_bytes(self) -> Mapping[str, int]: ...


_LIVE: weakref.WeakSet[Counted] = weakref.WeakSet()
_REGISTERED: set[int] = set()
_LOCK = threading.Lock()
_IDS = itertools.count(1)


def track(backend: Counted) -> str:
    """Called by every managed backend as it is made (cheap: a weak reference); returns its
    `backend` label, unique in this process (an id() could be reused by a later backend)."""
    with _LOCK:
        _LIVE.add(backend)
        return str(next(_IDS))


class BackendCollector:
    """A prometheus-client collector over the live managed backends of this process."""

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily

        restarts = CounterMetricFamily(
            "managed_scorers_restarts",
            "Child restarts that count against the policy.",
            labels=["scorer", "backend", "rank"],
        )
        timeouts = CounterMetricFamily(
            "managed_scorers_timeouts",
            "Calls past their deadline (the child was killed).",
            labels=["scorer", "backend", "rank"],
        )
        transport = CounterMetricFamily(
            "managed_scorers_transport_bytes",
            "Request bytes by path.",
            labels=["scorer", "backend", "rank", "path"],
        )
        with _LOCK:
            live = list(_LIVE)
        rank = str(ranks.current().rank)  # this trainer rank (torchrun's RANK; 0 alone)
        for backend in live:
            labels = [backend.scorer_name, backend.metrics_id, rank]
            restarts.add_metric(labels, backend.restarts)
            timeouts.add_metric(labels, backend.timeouts)
            for path in ("in_band", "shared_copied", "shared_in_place"):
                transport.add_metric([*labels, path], backend.transport_bytes()[path])
        yield from (restarts, timeouts, transport)


def register(registry: Any = None) -> BackendCollector:
    """Add the collector to `registry` (default: prometheus-client's global one), once per registry.
    Without prometheus-client, a ConfigError naming the `metrics` extra."""
    missing = install.missing_extra("metrics", "supervisor.backends.prometheus.register()")
    if missing is not None:
        raise ConfigError(missing)
    from prometheus_client import REGISTRY

    target = REGISTRY if registry is None else registry
    collector = BackendCollector()
    if id(target) not in _REGISTERED:
        target.register(collector)
        _REGISTERED.add(id(target))
    return collector
