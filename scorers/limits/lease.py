"""`EndpointLease`: one call's right to begin, ended exactly once with how the call went; the
node's `Lease` and the coordinator's `RemoteLease` say it to their own limiter. Stdlib only."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Report:
    """How a call went: the tokens its answer used (None: unknown, the estimate stands), its
    latency (None: no answer, the window is left as it is), a throttle and its Retry-After."""

    tokens_used: int | None = None
    latency_s: float | None = None
    throttled: bool = False
    retry_after_s: float | None = None


class EndpointLease:
    """One call's right to begin; `end` it exactly once (later ends do nothing)."""

    waited_s: float
    ended: bool

    def end(
        self,
        tokens_used: int | None = None,
        latency_s: float | None = None,
        throttled: bool = False,
        retry_after_s: float | None = None,
    ) -> None:
        if self.ended:
            return
        self.ended = True
        self._over(Report(tokens_used, latency_s, throttled, retry_after_s))

    def _over(self, report: Report) -> None:
        raise NotImplementedError
