"""The admission rule of a fake endpoint with a hard limit, shared by the bench's endpoint and the
tests' fake OpenAI judge API: it counts requests in flight and arrivals, and refuses a request past
`concurrency` in flight or past `per_second` arrivals in the trailing second. A request it admits
is served in `base_s + per_load_s * in_flight` (latency rises with load), and counts as in flight
until its server calls `done` just before writing the answer, so a client that ends its lease once
answered can never make the count pass its slots. Stdlib only."""

from __future__ import annotations

import bisect
import threading
import time


def peak_in_window(times: list[float], window_s: float) -> int:
    """The most of `times` (sorted) in any `window_s` seconds."""
    ends = (bisect.bisect_right(times, t + window_s) - i for i, t in enumerate(times))
    return max(ends, default=0)


class HardLimit:
    """What the endpoint has seen: `arrivals` (in order), `in_flight` and its peak, `throttled`
    (refused) and `answered`."""

    def __init__(
        self,
        concurrency: int | None = None,
        per_second: int | None = None,
        base_s: float = 0.0,
        per_load_s: float = 0.0,
    ) -> None:
        self.concurrency, self.per_second = concurrency, per_second
        self.base_s, self.per_load_s = base_s, per_load_s
        self._lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        with self._lock:
            self.arrivals: list[float] = []
            self.in_flight = self.peak_in_flight = self.throttled = self.answered = 0

    def peak_in_window(self, window_s: float) -> int:
        """The most arrivals in any `window_s` seconds."""
        return peak_in_window(self.arrivals, window_s)

    def peak_per_second(self) -> int:
        return self.peak_in_window(1.0)

    def admit(self) -> float | None:
        """Count an arrival; the seconds to serve it, or None to refuse it (429)."""
        now = time.monotonic()
        with self._lock:
            self.arrivals.append(now)  # appended under the lock: in order
            self.in_flight += 1
            self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
            recent = len(self.arrivals) - bisect.bisect_right(self.arrivals, now - 1.0)
            over_rate = self.per_second is not None and recent > self.per_second
            if (self.concurrency is not None and self.in_flight > self.concurrency) or over_rate:
                self.throttled += 1
                self.in_flight -= 1
                return None
            return self.base_s + self.per_load_s * self.in_flight

    def done(self) -> None:
        with self._lock:
            self.in_flight -= 1
            self.answered += 1
