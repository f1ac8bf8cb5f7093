"""One retry loop: tries until one succeeds, under an absolute deadline and capped exponential
backoff.

Every caller that repeats a failed try (the remote backend, the loopback client, the LLM judge, a
coroutine waiting for queue room) needs the same bounds: a pause that doubles up to a cap, no pause
that would reach the deadline, an optional limit on tries. What differs is kept with the caller:
which errors are retried, what a pause may be interrupted by, what is raised once the tries end.
So this loop never wraps an error: when it gives up it re-raises the last try's error as it is
(traceback intact), and `gave_up` says why, for the caller to raise its own typed error from it.

It lives in `scorers.common`, the lowest floor: `supervisor` and `scorers` may both import it,
and it imports nothing but the standard library (the loopback client must not load
httpx, so `scorers.common.bounded_http` is no home for it). Nobody jitters today, so neither does
this.
"""

from __future__ import annotations

import asyncio
import email.utils
import math
import time
from collections.abc import Callable
from typing import Literal, TypeVar

T = TypeVar("T")
GaveUp = Literal["refused", "tries", "deadline", "stopped"]


def _always(exc: Exception) -> bool:
    return True


def _forever() -> bool:
    return True


def _no_pause(exc: Exception) -> float:
    return 0.0


def _nothing(exc: Exception, tries: int, pause: float) -> None:
    return None


def retry_after_s(value: str | None) -> float | None:
    """An HTTP Retry-After in seconds from now: its delta-seconds, or its HTTP-date less the wall
    clock (0 once past); None when absent or unreadable (the caller's own schedule applies)."""
    if value is None:
        return None
    text = value.strip()
    try:
        seconds = float(text)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(text)
        except (TypeError, ValueError):
            return None
        if when.tzinfo is None:
            return None  # an HTTP-date is always GMT: one without a zone is not one
        seconds = when.timestamp() - time.time()
    return max(seconds, 0.0) if math.isfinite(seconds) else None


class Retry:
    """The bounds of one call's retries, and how that call's retries ended.

    `deadline` is absolute (`time.monotonic()`): the pauses and the tries share it. After a failure
    of a `retry_on` type the loop gives up, re-raising that error, when `retry_if(error)` is false
    ("refused"), `max_tries` tries have run ("tries"), the next pause would reach the deadline
    ("deadline"), or `go_on()` is false ("stopped"), in that order. Otherwise it calls
    `on_retry(error, tries, pause)`, then `sleep(pause)`: a `sleep` may raise to stop the loop.
    A pause is the doubling schedule, or what the error asks for (`asked_pause`, a Retry-After) when
    that is longer, never more than `max_pause_s` (or `max_asked_pause_s` for an asked pause: a
    caller that honours Retry-After in full passes `math.inf`, and the deadline still bounds it).
    Errors of other types propagate at once.
    """

    def __init__(  # noqa: PLR0913 - one retry policy: each caller names the few it sets
        self,
        deadline: float,
        first_pause_s: float,
        max_pause_s: float,
        *,
        retry_on: tuple[type[Exception], ...],
        retry_if: Callable[[Exception], bool] = _always,
        max_tries: int | None = None,
        go_on: Callable[[], bool] = _forever,
        asked_pause: Callable[[Exception], float] = _no_pause,
        max_asked_pause_s: float | None = None,
        on_retry: Callable[[Exception, int, float], None] = _nothing,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if (
            not 0 < first_pause_s
            or not 0 < max_pause_s
            or (max_tries is not None and max_tries < 1)
        ):
            raise ValueError("need first_pause_s > 0, max_pause_s > 0 and max_tries >= 1 (or None)")
        self.deadline, self.max_pause_s, self.max_tries = deadline, max_pause_s, max_tries
        self.max_asked_pause_s = max_pause_s if max_asked_pause_s is None else max_asked_pause_s
        self.retry_on, self.retry_if, self.go_on = retry_on, retry_if, go_on
        self.asked_pause, self.on_retry, self.sleep = asked_pause, on_retry, sleep
        self._scheduled = first_pause_s
        self.tries = 0  # tries begun so far
        self.gave_up: GaveUp | None = None  # why the last error was re-raised; None while retrying

    def call(self, attempt: Callable[[], T]) -> T:
        """`attempt()`'s result, from the first try that succeeds."""
        while True:
            outcome = self._try(attempt)
            if isinstance(outcome, tuple):
                return outcome[0]
            # outside the handler: an error it raises is not chained to the try's
            self.sleep(outcome)

    async def call_async(self, attempt: Callable[[], T]) -> T:
        """`call` for a coroutine: the pauses are `asyncio.sleep` (not `sleep`), the event loop
        stays free."""
        while True:
            outcome = self._try(attempt)
            if isinstance(outcome, tuple):
                return outcome[0]
            await asyncio.sleep(outcome)

    def _try(self, attempt: Callable[[], T]) -> tuple[T] | float:
        """One try: (its result,), or the pause before the next; the try's error when the loop gives
        up."""
        self.tries += 1
        try:
            return (attempt(),)
        except self.retry_on as exc:
            pause = self._pause_after(exc)
            if pause is None:
                raise
        return pause

    def _pause_after(self, exc: Exception) -> float | None:
        """The pause before the next try, or None (and `gave_up` set) when there is none."""
        pause = max(
            min(self.max_pause_s, self._scheduled),
            min(self.max_asked_pause_s, self.asked_pause(exc)),
        )
        self._scheduled = min(self.max_pause_s, self._scheduled * 2)
        if not self.retry_if(exc):
            self.gave_up = "refused"
        elif self.max_tries is not None and self.tries >= self.max_tries:
            self.gave_up = "tries"
        elif time.monotonic() + pause >= self.deadline:
            self.gave_up = "deadline"
        elif not self.go_on():
            self.gave_up = "stopped"
        else:
            self.on_retry(exc, self.tries, pause)
            return pause
        return None
