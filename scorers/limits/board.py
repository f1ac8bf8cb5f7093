"""One endpoint's limits as the cross-node coordinator keeps them: the node's `LocalLimiter` rules
(`bucket.Levels`, the adaptive `window`) over leases in memory instead of files. Pure: no I/O, no
waiting; the coordinator's server (`supervisor.limits`) waits on what `offer` answers.

A lease is a slot in flight, taken before the call's rate reservation, as on a node. Nothing tells
the coordinator that a caller died, so a lease lives `LEASE_TTL_S` past its last renewal (callers
renew theirs every `RENEW_S`): a rank killed -9 gives its slots back within that. A board with no
live lease and no caller for `LEASE_TTL_S` takes a new declaration (the limits changed once every
old caller is gone); before that, another declaration is a conflict. `nodes` is how many hosts
called in the last `NODE_MEMORY_S`: a caller's fallback share when the coordinator is gone.
Stdlib only.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from typing import Any

from scorers.limits import window
from scorers.limits.bucket import Levels
from scorers.limits.declared import EndpointLimit

RENEW_S = 2.0
LEASE_TTL_S = 10.0
NODE_MEMORY_S = 600.0


@dataclass(frozen=True)
class Grant:
    lease: str
    start_in: float  # the rate reservation: the caller sends this much later


@dataclass(frozen=True)
class Hold:
    """No lease now: `which` limit holds it, for `seconds` (None: until a lease ends)."""

    which: str
    seconds: float | None


@dataclass
class Board:
    limit: EndpointLimit
    levels: Levels
    leases: dict[str, float] = field(default_factory=dict)  # id -> expires at
    hosts: dict[str, float] = field(default_factory=dict)  # host -> last seen
    last_seen: float = 0.0

    @classmethod
    def new(cls, limit: EndpointLimit, now: float) -> Board:
        return cls(limit, Levels.full(limit, now), last_seen=now)

    def idle(self, now: float) -> bool:
        """No live lease and no caller for a lease's lifetime: a new declaration may replace it."""
        self.expire(now)
        return not self.leases and now - self.last_seen > LEASE_TTL_S

    def seen(self, host: str, now: float) -> int:
        """A caller from `host` now; how many hosts called lately."""
        self.last_seen = self.hosts[host] = now
        for name, when in list(self.hosts.items()):
            if now - when > NODE_MEMORY_S:
                del self.hosts[name]
        return len(self.hosts)

    def expire(self, now: float) -> None:
        for lease, expires in list(self.leases.items()):
            if expires <= now:
                del self.leases[lease]

    def usable(self) -> int:
        if self.limit.adaptive:
            return window.usable(self.levels)
        return self.limit.concurrency or 0

    def offer(self, tokens: int, now: float, wait_left: float) -> Grant | Hold:
        """A lease for a call of `tokens` if one may begin within `wait_left` seconds (its rate
        reservation made, into debt as on a node); else what holds it."""
        self.expire(now)
        if self.limit.concurrency and len(self.leases) >= self.usable():
            window.filled(self.levels, now)
            expiry = min(self.leases.values(), default=now) - now
            return Hold(f"concurrency ({self.usable()} in flight of {self.limit.concurrency})",
                        max(expiry, 0.0) if self.leases else None)  # fmt: skip
        wait, which = self.levels.wait_for(self.limit, tokens, now)
        if which == "Retry-After" or wait > wait_left:
            return Hold(f"{which} ({self.limit.describe()})", wait)
        self.levels.take(self.limit, tokens)
        lease = secrets.token_hex(8)  # never an id an old caller may still hold
        self.leases[lease] = now + wait + LEASE_TTL_S
        return Grant(lease, wait)

    def renew(self, leases: list[str], now: float) -> list[str]:
        """Those of `leases` still held live on; the ids no longer known (expired) are answered."""
        self.expire(now)
        self.last_seen = now
        unknown = [lease for lease in leases if lease not in self.leases]
        for lease in leases:
            if lease in self.leases:
                self.leases[lease] = max(self.leases[lease], now + LEASE_TTL_S)
        return unknown

    def end(self, lease: str, report: dict[str, Any], now: float) -> bool:
        """The call of `lease` is over (`report`: tokens_used, latency_s, throttled,
        retry_after_s, as `Lease.end` takes them); False when the lease had expired."""
        known = self.leases.pop(lease, None) is not None
        self.last_seen = now
        levels, used = self.levels, report.get("tokens_used")
        if used is not None and report.get("tokens") is not None:
            levels.give_back(self.limit, int(report["tokens"]) - int(used), now)
        if report.get("retry_after_s"):
            levels.pause = max(levels.pause, now + float(report["retry_after_s"]))
        if self.limit.adaptive and self.limit.concurrency:
            if report.get("throttled"):
                window.cut(levels, now)
            elif report.get("latency_s") is not None:
                window.answered(levels, self.limit.concurrency, float(report["latency_s"]), now)
        return known
