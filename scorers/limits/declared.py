"""`EndpointLimit`: the limits one named endpoint takes, as declared (a judge's `endpoint_limit`).

Requests per minute, tokens per minute and requests in flight (`concurrency`); each may be left out
(that dimension is then not limited), but not all of them. `adaptive` makes the in-flight window
adapt below `concurrency` (AIMD, `scorers.limits.window`). `divided(world)` is the conservative
local share a cross-node coordinator falls back to when it cannot be reached. Stdlib only.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any
from urllib.parse import urlsplit

KEYS = ("name", "requests_per_minute", "tokens_per_minute", "concurrency", "adaptive")
MAX_NAME_CHARS = 300


def _positive(name: str, value: Any, integer: bool) -> None:
    kinds = (int,) if integer else (int, float)
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, kinds) or not value > 0:
        raise ValueError(
            f"endpoint_limit: {name} must be a positive {'int' if integer else 'number'} or "
            f"left out, got {value!r}"
        )
    if not math.isfinite(value):
        raise ValueError(f"endpoint_limit: {name} must be finite, got {value!r}")


def default_name(base_url: str) -> str:
    """An endpoint's name when none is given: host:port and path of its base URL (the scheme's
    default port written out), so every caller of one endpoint shares one limit."""
    url = urlsplit(base_url)
    port = url.port or (443 if url.scheme == "https" else 80)
    return f"{(url.hostname or '').lower()}:{port}{url.path.rstrip('/')}"


@dataclass(frozen=True)
class EndpointLimit:
    """One endpoint's limits, shared by every process that calls it on this node."""

    name: str
    requests_per_minute: float | None = None
    tokens_per_minute: float | None = None
    concurrency: int | None = None
    adaptive: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not 0 < len(self.name) <= MAX_NAME_CHARS:
            raise ValueError(
                f"endpoint_limit: name must be a string of 1 to {MAX_NAME_CHARS} characters, "
                f"got {self.name!r}"
            )
        _positive("requests_per_minute", self.requests_per_minute, integer=False)
        _positive("tokens_per_minute", self.tokens_per_minute, integer=False)
        _positive("concurrency", self.concurrency, integer=True)
        if not isinstance(self.adaptive, bool):
            raise ValueError(
                f"endpoint_limit: adaptive must be true or false, got {self.adaptive!r}"
            )
        if (self.requests_per_minute, self.tokens_per_minute, self.concurrency) == (None,) * 3:
            raise ValueError(
                "endpoint_limit: give at least one of requests_per_minute, tokens_per_minute, "
                "concurrency (an endpoint_limit that limits nothing is a mistake)"
            )
        if self.adaptive and self.concurrency is None:
            raise ValueError("endpoint_limit: adaptive needs concurrency (the window's ceiling)")

    @classmethod
    def from_param(cls, value: Any, base_url: str) -> EndpointLimit:
        """A recipe's `endpoint_limit:` mapping, checked; `name` defaults to the URL's."""
        if not isinstance(value, Mapping):
            raise ValueError(
                f"endpoint_limit must be a mapping like {{requests_per_minute: 600, concurrency: "
                f"16}}, got {value!r}"
            )
        unknown = sorted(set(value) - set(KEYS))
        if unknown:
            raise ValueError(f"endpoint_limit: unknown keys {unknown} (known: {list(KEYS)})")
        return cls(**{"name": default_name(base_url), **value})

    def declared(self) -> dict[str, Any]:
        """What every process of the node must agree on (the name is the file's, not compared)."""
        return {k: v for k, v in asdict(self).items() if k != "name"}

    def divided(self, world_size: int) -> EndpointLimit:
        """This process's share when the cross-node coordinator cannot be reached: each limit
        divided by the world size, rounded down, at least 1 (never unlimited)."""
        if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
            raise ValueError(f"world_size must be a positive int, got {world_size!r}")

        def share(value: float | None) -> float | None:
            return None if value is None else max(1.0, value / world_size)

        concurrency = self.concurrency
        return replace(
            self,
            requests_per_minute=share(self.requests_per_minute),
            tokens_per_minute=share(self.tokens_per_minute),
            concurrency=None if concurrency is None else max(1, concurrency // world_size),
        )

    def describe(self) -> str:
        parts = [
            f"{self.requests_per_minute:g} requests/min" if self.requests_per_minute else "",
            f"{self.tokens_per_minute:g} tokens/min" if self.tokens_per_minute else "",
            f"{self.concurrency} in flight" if self.concurrency else "",
        ]
        return ", ".join(p for p in parts if p)
