"""The node's shared levels for one endpoint, and the token-bucket arithmetic on them. Pure: no I/O.

Requests: a bucket of `requests_per_minute / 60` per second, holding at most one second's worth
(at least 1): so in any w seconds at most rate x (w + 1) requests begin. Tokens the same with
`tokens_per_minute`; a call whose estimate exceeds the bucket waits for a full bucket, so no
estimate can wait forever. A caller reserves what it needs at once, into debt, and sleeps until it
is due: callers begin in the order they came, each at a time known when it asks. `pause` is a
shared Retry-After: until then nothing begins. `window` is the adaptive in-flight window
(`scorers.limits.window`). Times are `time.monotonic()`, one clock for every process of the node.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from scorers.limits.declared import EndpointLimit


def _capacity(per_minute: float) -> float:
    return max(1.0, per_minute / 60.0)


@dataclass
class Levels:
    t: float  # when the buckets were last refilled
    req: float  # requests that may begin now
    tok: float  # tokens that may be spent now (negative: a debt)
    pause: float = 0.0  # nothing begins before this (a Retry-After, shared)
    window: float = 0.0  # the adaptive window (0: not adaptive)
    base_s: float = 0.0  # the latency the window compares against (0: none seen yet)
    cut_at: float = 0.0  # when the window was last cut
    ceiling: float = 0.0  # the window when it was last cut (0: never): growth slows near it
    full_at: float = 0.0  # when a caller last found every slot of the window held

    @classmethod
    def full(cls, limit: EndpointLimit, now: float) -> Levels:
        return cls(
            t=now,
            req=_capacity(limit.requests_per_minute or 60.0),
            tok=_capacity(limit.tokens_per_minute or 60.0),
            # the adaptive window's slow start (scorers.limits.window)
            window=float(min(limit.concurrency or 0, 4)) if limit.adaptive else 0.0,
        )

    @classmethod
    def of(cls, record: dict[str, Any]) -> Levels:
        # a field a record of an older version lacks keeps its default
        return cls(**{f.name: float(record.get(f.name, f.default)) for f in fields(cls)})

    def as_record(self) -> dict[str, float]:
        return asdict(self)

    def refill(self, limit: EndpointLimit, now: float) -> None:
        elapsed = now - self.t
        if elapsed < 0:  # another boot's record: nothing is credited
            self.t = now
            return
        if limit.requests_per_minute:
            rate = limit.requests_per_minute / 60.0
            self.req = min(_capacity(limit.requests_per_minute), self.req + elapsed * rate)
        if limit.tokens_per_minute:
            rate = limit.tokens_per_minute / 60.0
            self.tok = min(_capacity(limit.tokens_per_minute), self.tok + elapsed * rate)
        self.t = now

    def wait_for(self, limit: EndpointLimit, tokens: int, now: float) -> tuple[float, str]:
        """Seconds until a call of `tokens` may begin (0: now), and which limit holds it: a
        Retry-After first (nothing is reserved while it holds), else the longer bucket wait."""
        self.refill(limit, now)
        if self.pause > now:
            return self.pause - now, "Retry-After"
        waits = [(0.0, "")]
        if limit.requests_per_minute and self.req < 1:
            waits.append(((1 - self.req) * 60.0 / limit.requests_per_minute, "requests/min"))
        if limit.tokens_per_minute:
            need = min(float(tokens), _capacity(limit.tokens_per_minute))
            if self.tok < need:
                waits.append(((need - self.tok) * 60.0 / limit.tokens_per_minute, "tokens/min"))
        return max(waits)

    def take(self, limit: EndpointLimit, tokens: int) -> None:
        """Reserve one request and `tokens`, into debt if they are not there yet: the caller
        waits what `wait_for` said, and every later caller waits behind it."""
        if limit.requests_per_minute:
            self.req -= 1
        if limit.tokens_per_minute:
            self.tok -= tokens

    def give_back(self, limit: EndpointLimit, tokens: int, now: float) -> None:
        """Return `tokens` over-estimated (negative: charge an under-estimate)."""
        self.refill(limit, now)
        if limit.tokens_per_minute:
            self.tok = min(_capacity(limit.tokens_per_minute), self.tok + tokens)
