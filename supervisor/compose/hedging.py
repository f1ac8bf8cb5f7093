"""Hedged chunks: when to send a chunk once more to another server, and one send that can be given
up.

A chunk whose answer has not come within the p95 of the latencies its backend observed recently is
sent once more, to another server (`compose.remote_servers._Race`); the first good answer wins and
the other send is cancelled. Why p95: in a steady state about one chunk in twenty waits that long,
so hedging costs about 5 % more sends, while a server that stopped or stalls holds its chunk for
about p95 plus one more chunk's time, not the call's deadline ("The Tail at Scale", Dean and
Barroso, 2013: deferred hedged requests).

`Latencies` keeps the last `WINDOW` latencies of one backend's sends: the time from a send to its
answer; a send that failed counts nothing; a first send given up once its hedge answered counts as
the delay it was hedged at, the one bound known of its latency. Left out, it would pull the p95
down until about a fifth of the chunks were hedged; counted as its whole wait (the hedge's time
included), a server that stalls often would push the p95 up to its stalls, and its chunks would
then wait them out. Until `MIN_SAMPLES` are known the delay is `COLD_FRACTION` of the call's
deadline: before the backend has seen what normal is, a scorer whose chunks take long by nature (a
judge at 30 s a chunk) is not sent every chunk twice, and a hedge sent then still has three
quarters of the deadline to answer.
"""

from __future__ import annotations

import math
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from scorers.common.bounded_http import Cancel
from supervisor.types import RewardResponse

T = TypeVar("T")

WINDOW = 100  # latencies kept: about the last few calls' chunks
MIN_SAMPLES = 10  # before these, the cold delay (with fewer than 20, the p95 is the largest)
QUANTILE = 0.95
COLD_FRACTION = 0.25  # of the call's deadline, while fewer than MIN_SAMPLES are known
# a call's hedges, counted in its response's diagnostics beside the scorer's own (runtime's names)
HEDGES_SENT, HEDGES_WON = "runtime.hedges_sent", "runtime.hedges_won"


def counted(response: RewardResponse, scorer: str, hedges: dict[str, int]) -> RewardResponse:
    """`response` with one call's hedges added to its scorer's report: counts, so they add up over
    calls, ranks and a step as the scorer's own do."""
    reports = dict(response.diagnostics)
    report = reports.get(scorer) or {"sample_count": len(response.ids), "values": {}}
    reports[scorer] = {**report, "values": {**report["values"], **hedges}}
    return response.model_copy(update={"diagnostics": reports})


class Latencies:
    """One backend's recent send latencies, its hedge delay, and its hedges counted; thread-safe."""

    def __init__(self, deadline_s: float) -> None:
        self.cold_s = COLD_FRACTION * deadline_s
        self._lock = threading.Lock()
        self._seconds: deque[float] = deque(maxlen=WINDOW)
        self.sent = 0  # chunks sent once more after the delay
        self.won = 0  # of those, answered first by the second server
        # chunks whose hedge found every other server lagging at first, and looked again
        self.deferred = 0

    def add(self, seconds: float) -> None:
        with self._lock:
            self._seconds.append(seconds)

    def delay(self) -> float:
        """The p95 (nearest rank) of the window, or the cold delay while it holds too few."""
        with self._lock:
            seconds = sorted(self._seconds)
        if len(seconds) < MIN_SAMPLES:
            return self.cold_s
        return seconds[math.ceil(QUANTILE * len(seconds)) - 1]

    def count(self, *, won: bool) -> None:
        with self._lock:
            if won:
                self.won += 1
            else:
                self.sent += 1

    def count_deferred(self) -> None:
        with self._lock:
            self.deferred += 1

    def stats(self) -> dict[str, Any]:
        with self._lock:
            samples, sent, won, deferred = len(self._seconds), self.sent, self.won, self.deferred
        return {
            "hedges_sent": sent,
            "hedges_won": won,
            "hedges_deferred": deferred,
            "hedge_delay_s": self.delay(),
            "latency_samples": samples,
        }


class Attempt(Generic[T]):
    """One send to server `index`, `send(cancel)`, in a daemon thread of its own; its outcome (the
    answer, or the exception) is put on `ended` with it. `cancel()` gives it up: its request is
    closed, and its outcome is then nobody's."""

    def __init__(
        self,
        index: int,
        send: Callable[[Cancel], T],
        ended: queue.Queue[tuple[Attempt[T], T | BaseException]],
        name: str,
    ) -> None:
        self.index = index
        self.began = time.monotonic()
        self._cancel = Cancel()

        def run() -> None:
            try:
                outcome: T | BaseException = send(self._cancel)
            except BaseException as exc:  # noqa: BLE001 - handed to the race, which raises or records it
                outcome = exc
            ended.put((self, outcome))

        threading.Thread(target=run, name=name, daemon=True).start()

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    def cancel(self) -> None:
        self._cancel.cancel()
