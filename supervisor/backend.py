"""The one interface a trainer calls, whatever runs the scorer.

`RewardBackend` is the trainer's contract, ten names: `compute_rewards` (and `submit`,
`compute_rewards_async`, `stream`, its other forms), `onload`, `offload`, `drain` (residency),
`arena`, `close` (and the context manager), `fail_step`. What the library itself asks of a backend
it holds (its scorer, its members, how its calls are cut) is `supervisor.composition.Component`.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from abc import ABC, abstractmethod
from concurrent.futures import Future
from typing import Any, Self

from scorers.common.retry import Retry
from supervisor.arena import Arena, HeapArena
from supervisor.errors import ScorerUnavailable
from supervisor.outcome import Outcome
from supervisor.stream import RewardStream
from supervisor.submit import DEFAULT_MAX_PENDING, Submission, SubmissionQueueFull, Submitter
from supervisor.types import RewardRequest, RewardResponse

_SUBMITTER_LOCK = threading.Lock()


def _fresh_submitter_lock() -> None:
    """A fork may happen while another thread holds the lock: the child gets a free one."""
    global _SUBMITTER_LOCK
    _SUBMITTER_LOCK = threading.Lock()


os.register_at_fork(after_in_child=_fresh_submitter_lock)


class RewardBackend(ABC):
    """`compute_rewards` (and `submit`, its non-blocking form) plus residency and lifecycle;
    usable as a context manager. A subclass implements `compute_rewards`, and what it has of the
    rest."""

    _max_pending: int = DEFAULT_MAX_PENDING  # submissions that may wait (see supervisor.submit)
    _max_queue_wait_s: float = 600.0  # how long compute_rewards_async waits for room in that queue
    _submitter: Submitter | None = None
    _submissions_closed = False

    @abstractmethod
    def compute_rewards(self, request: RewardRequest) -> RewardResponse: ...

    def submit(self, request: RewardRequest) -> Future[RewardResponse]:
        """Queue `request` and return at once; the future holds its response or its typed error.
        Requests are sent one at a time, in order: each one's deadline is its own service time."""
        self._check_owner()  # in a fork: raise here, not later on the future
        with _SUBMITTER_LOCK:
            if self._submissions_closed:
                raise ScorerUnavailable(
                    f"{type(self).__name__} is closed: nothing more can be submitted"
                )
            if self._submitter is None or not self._submitter.owned_here():
                # none yet, or a fork's copy of its parent's (whose worker thread did not fork with
                # it): a backend any process may use gets a submitter of this process's own
                self._submitter = Submitter(
                    self._outcome, type(self).__name__, self._max_pending, interrupt=self._interrupt
                )
            submitter = self._submitter
        return submitter.submit(request)

    async def compute_rewards_async(self, request: RewardRequest) -> RewardResponse:
        """`compute_rewards` for a coroutine: the event loop is free while the request is scored.

        When `max_pending` submissions already wait, the coroutine waits for room (up to
        `max_queue_wait_s`) instead of failing: a loop of per-item tasks (verl's) is
        backpressure, not an error. `submit()` itself never waits."""
        room = Retry(
            time.monotonic() + self._max_queue_wait_s, 0.001, 0.05, retry_on=(SubmissionQueueFull,)
        )
        # the last SubmissionQueueFull, past the wait
        future = await room.call_async(lambda: self.submit(request))
        try:
            return await asyncio.wrap_future(future)
        # Ctrl-C in asyncio.run, or the caller's own cancel: nobody will read it
        except asyncio.CancelledError:
            if isinstance(future, Submission):
                future.abandon()
            raise

    def stream(self, group_size: int | None = None, **options: Any) -> RewardStream:
        """Score items as they finish (see supervisor.stream): `add` them one by one or in runs,
        collect the step's rewards at `results()`. Options: window, max_wait_s, max_pending,
        max_block_s, collect."""
        configured, whole_groups = self._grouping()
        size = group_size if group_size is not None else configured
        return RewardStream(self, size, whole_groups=whole_groups, **options)

    def onload(self) -> dict[str, Any]:
        """Bring the scorer's model onto its device; what it reports (a backend without one: {})."""
        return {}

    def offload(self) -> dict[str, Any]:
        """Move the scorer's model off its device, freeing it for the trainer."""
        return {}

    def drain(self) -> dict[str, Any]:
        """Wait for what the scorer still holds in flight; what it reports."""
        return {}

    def arena(self) -> Arena:
        """Where to build large input arrays before scoring them. A managed child's arena is in
        its shared segment, so those arrays reach the scorer without a copy; elsewhere it is
        ordinary memory. Arrays are valid until the arena is closed (use it as a context
        manager)."""
        return HeapArena()

    def fail_step(self, error: Exception, step: int | None = None) -> None:
        """The caller could not build its request for `step` and is about to raise `error`. Alone,
        there is nobody to tell; across ranks, every rank raises the same RankFailed instead."""
        return None

    def close(self) -> None:
        """Release everything; idempotent and bounded."""
        self._stop_submissions()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- hooks of the forms above, for the backends that have more to say ------------------------
    def _check_owner(self) -> None:
        """Raise BackendNotOwned in a process that may not use this backend (a fork of its owner).
        An in-process or remote backend has no child to protect: any process may use it."""
        return None

    def _interrupt(self) -> None:
        """Give up on calls in flight from other threads (Ctrl-C in a caller of `submit`)."""
        return None

    def _outcome(self, request: RewardRequest) -> Outcome:
        """What a submission runs: this backend's answer as a value (see supervisor.outcome)."""
        return Outcome.scored(self.compute_rewards(request))

    def _grouping(self) -> tuple[int | None, bool]:
        """The group size it was configured with, and whether it scores whole groups only: a backend
        that says nothing of its scorer may be groupwise, so its streams need a group size."""
        return None, True

    def _stop_submissions(self) -> None:
        """Called first by every close(): what waits fails, nothing new is accepted."""
        with _SUBMITTER_LOCK:
            self._submissions_closed = True
            submitter, self._submitter = self._submitter, None
        if submitter is not None:
            submitter.close()
