"""Shared limits per named endpoint: requests per minute, tokens per minute and requests in flight,
for every process that calls the endpoint on this node (docs/scale.md, "Shared endpoints").

A caller opens a limiter for an `EndpointLimit`, then for each call `acquire(tokens, deadline)` ->
`Lease`, and `lease.end(...)` with what happened. `LocalLimiter` is the node's mechanism (files
under a private per-user directory, `flock`); a cross-node coordinator is another
`EndpointLimiter` with the same two calls, and falls back to `EndpointLimit.divided(world_size)`
when it cannot be reached. Stdlib only: it runs in every scorer env.
"""

from __future__ import annotations

from typing import Protocol

from scorers.limits.declared import EndpointLimit, default_name
from scorers.limits.errors import LimitConflict, LimitError, LimitStateError, LimitTimeout
from scorers.limits.lease import EndpointLease
from scorers.limits.local import Lease, LocalLimiter
from scorers.limits.remote import CoordinatedLimiter, Coordination


class EndpointLimiter(Protocol):
    """What a caller of a limited endpoint needs: the node's `LocalLimiter`, or a coordinator."""

    limit: EndpointLimit

    def acquire(self, tokens: int, deadline: float) -> EndpointLease: ...

    def close(self) -> None: ...


def open_limiter(limit: EndpointLimit, coordination: Coordination | None) -> EndpointLimiter:
    """The coordinator's leases where one is named, else the node's."""
    if coordination is None:
        return LocalLimiter(limit)
    return CoordinatedLimiter(limit, coordination)


__all__ = [
    "Coordination",
    "CoordinatedLimiter",
    "EndpointLease",
    "EndpointLimit",
    "EndpointLimiter",
    "Lease",
    "LimitConflict",
    "LimitError",
    "LimitStateError",
    "LimitTimeout",
    "LocalLimiter",
    "default_name",
    "open_limiter",
]
