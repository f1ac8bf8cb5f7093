"""`LocalLimiter`: one endpoint's limits for every process of this node (the default limiter).

`acquire(tokens, deadline)` waits for a concurrency slot (`slots`), then for the request and token
buckets and any shared Retry-After (`ledger`, `bucket`), all within `deadline`; past it, it raises
`LimitTimeout` naming the endpoint and the limit that held it. The `Lease` it answers is ended once
with what happened: the tokens the answer used (the estimate reconciled), a throttle and its
Retry-After (which pauses the endpoint for every process), the latency (the adaptive window's
input). A cross-node coordinator implements the same two calls (`scorers.limits.EndpointLimiter`).
Stdlib only.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, replace

from scorers.limits import window
from scorers.limits.bucket import Levels
from scorers.limits.declared import EndpointLimit
from scorers.limits.errors import LimitError, LimitTimeout
from scorers.limits.lease import EndpointLease, Report
from scorers.limits.ledger import Ledger
from scorers.limits.rundir import endpoint_base, limits_dir
from scorers.limits.slots import Slots


@dataclass
class Lease(EndpointLease):
    """A lease of the node's files: `end` gives the slot back and tells the endpoint's record how
    the call went."""

    limiter: LocalLimiter
    slot: int | None
    tokens: int
    waited_s: float
    ended: bool = False

    def _over(self, report: Report) -> None:
        try:
            self.limiter._ended(self, report)
        finally:
            if self.slot is not None:
                self.limiter._slots.give(self.slot)
            self.limiter._drop()


class LocalLimiter:
    """`limit` for every process of this node that opens it; `close()` when done. Its files stay
    open until the last lease taken before `close()` has ended (a call still in flight on a
    thread past its batch's deadline ends it later), so no update is lost or written elsewhere."""

    def __init__(self, limit: EndpointLimit) -> None:
        self.limit, self._pid = limit, os.getpid()
        self._lock, self._open, self._closing = threading.Lock(), 0, False
        base = endpoint_base(limits_dir(), limit.name)
        self._ledger = Ledger(base, limit)
        try:
            self._ledger.register(time.monotonic())
        except BaseException:
            self._ledger.close()
            raise
        self._slots = Slots(base, limit.concurrency or 0)
        self._usable = limit.concurrency or 0

    def close(self) -> None:
        with self._lock:
            if self._closing:
                return
            self._closing = True
            last = self._open == 0
        if last:
            self._ledger.close()

    def _hold(self) -> None:
        """One more acquisition or lease using the files (refused once closed, or in a fork)."""
        if os.getpid() != self._pid:
            raise LimitError(
                f"endpoint {self.limit.name!r}: a limiter opened in pid {self._pid} used in pid "
                f"{os.getpid()} (a forked copy opens its own)"
            )
        with self._lock:
            if self._closing:
                raise LimitError(f"endpoint {self.limit.name!r}: the limiter is closed")
            self._open += 1

    def _drop(self) -> None:
        with self._lock:
            self._open -= 1
            last = self._closing and self._open == 0
        if last:
            self._ledger.close()

    def levels(self) -> Levels:
        """A copy of the endpoint's shared levels now (buckets refilled to now): to look at."""
        with self._ledger.locked() as record:
            assert record.levels is not None
            record.levels.refill(self.limit, time.monotonic())
            return replace(record.levels)

    def acquire(self, tokens: int, deadline: float) -> Lease:
        """A lease to begin one call of about `tokens` tokens, by `deadline` (monotonic)."""
        self._hold()
        try:
            slot, waited = self._take(tokens, deadline)
        except BaseException:
            self._drop()
            raise
        return Lease(self, slot, tokens, waited)

    def _take(self, tokens: int, deadline: float) -> tuple[int | None, float]:
        """A slot, then the rates; the slot and the seconds it all took."""
        began = time.monotonic()
        slot = None
        if self.limit.concurrency:
            adaptive = self.limit.adaptive
            on_full = self._filled if adaptive else None
            slot = self._slots.take(self._window_now, deadline, counted=adaptive, on_full=on_full)
            if slot is None:
                raise LimitTimeout(
                    self.limit.name,
                    f"concurrency ({self._usable} in flight of {self.limit.concurrency})",
                    time.monotonic() - began,
                    f"slots last held by pids {self._slots.holders()}",
                )
        try:
            self._begin(tokens, deadline, began)
        except BaseException:
            if slot is not None:
                self._slots.give(slot)
            raise
        return slot, time.monotonic() - began

    def _filled(self) -> None:
        """Every slot of the window was held when this caller came: the window is in use."""
        with self._ledger.locked() as record:
            assert record.levels is not None
            window.filled(record.levels, time.monotonic())

    def _window_now(self) -> int:
        if self.limit.adaptive:
            with self._ledger.locked() as record:
                assert record.levels is not None
                self._usable = window.usable(record.levels)
        return self._usable

    def _begin(self, tokens: int, deadline: float, began: float) -> None:
        """Reserve the call's request and tokens (in the order callers come: a reservation is
        taken into debt), sleep until they are due, then until no Retry-After holds the
        endpoint; past the deadline, `LimitTimeout` (a reservation made is spent all the same)."""
        reserved = False
        while True:
            with self._ledger.locked(deadline) as record:
                now = time.monotonic()  # under the lock: a time read before it may be stale
                levels = record.levels
                assert levels is not None
                if reserved:
                    wait, which = max(levels.pause - now, 0.0), "Retry-After"
                else:
                    wait, which = levels.wait_for(self.limit, tokens, now)
                    if which != "Retry-After" and now + wait <= deadline:
                        levels.take(self.limit, tokens)
                        reserved = True
            if now + wait > deadline:
                raise LimitTimeout(
                    self.limit.name,
                    f"{which} ({self.limit.describe()})",
                    now - began,
                    f"{wait:.2f} s more needed",
                )
            if wait == 0:
                return
            time.sleep(wait)

    def _ended(self, lease: Lease, report: Report) -> None:
        with self._ledger.locked() as record:
            now = time.monotonic()  # under the lock, as in `_begin`
            levels = record.levels
            assert levels is not None
            if report.tokens_used is not None:
                levels.give_back(self.limit, lease.tokens - report.tokens_used, now)
            if report.retry_after_s:
                levels.pause = max(levels.pause, now + report.retry_after_s)
            if self.limit.adaptive and self.limit.concurrency:
                if report.throttled:
                    window.cut(levels, now)
                elif report.latency_s is not None:
                    window.answered(levels, self.limit.concurrency, report.latency_s, now)
