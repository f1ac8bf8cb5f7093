"""Non-blocking scoring: a backend's submissions, in a bounded queue, one in flight at a time.

One worker thread per backend takes submissions in order and calls the backend's own
`compute_rewards`, so a request's deadline starts when it is sent (its service time,
not its queue time), a managed child serves one request at a time, and when a child dies
only the request in flight fails: the queued ones (never sent) go to the restarted child.
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from supervisor.errors import BackendNotOwned, ScorerError, ScorerUnavailable
from supervisor.outcome import Outcome

DEFAULT_MAX_PENDING = 64
_STOP = object()


class SubmissionQueueFull(ScorerError):
    """More submissions are waiting than the backend's bound: the trainer outpaces the scorer."""


class Submission(Future[Any]):
    """A submitted request's future. Ctrl-C while waiting on its result abandons the call, as Ctrl-C
    in a plain call does: a request still queued is never sent, the one in flight is interrupted (a
    managed child is killed at once, so the trainer's exit does not wait for it)."""

    def __init__(self, interrupt: Callable[[Submission], None]) -> None:
        super().__init__()
        self._interrupt = interrupt
        self.outcome: Outcome | None = None  # the call's outcome as a value, once it ended

    def settle(self, outcome: Outcome) -> None:
        """End with `outcome`: its response, or its error (what `result()` raises)."""
        self.outcome = outcome
        if outcome.error is not None:
            self.set_exception(outcome.error)
        else:
            self.set_result(outcome.response)

    def result(self, timeout: float | None = None) -> Any:
        try:
            return super().result(timeout)
        except BaseException as exc:
            if not isinstance(exc, Exception) and not self.done():  # raised while waiting (Ctrl-C)
                self.abandon()
            raise

    def abandon(self) -> None:
        """Nobody will read this answer."""
        if not self.cancel() and not self.done():  # running: only interrupting the backend ends it
            self._interrupt(self)


class Submitter:
    """The worker behind `RewardBackend.submit`: started on first use, stopped by the backend's
    close()."""

    def __init__(
        self,
        call: Callable[[Any], Outcome],
        name: str,
        max_pending: int = DEFAULT_MAX_PENDING,
        interrupt: Callable[[], None] = lambda: None,
    ) -> None:
        self._call = call
        self._interrupt = interrupt
        self._running: Submission | None = None  # the submission whose call is in flight
        self._running_lock = threading.Lock()
        self._name = name
        self._owner_pid = os.getpid()
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=max_pending)
        self._lock = threading.Lock()
        self._closed = False
        # daemon: a trainer that exits (Ctrl-C) never waits here; its backends' close() ends the
        # calls
        self._thread = threading.Thread(target=self._run, name=f"submit-{name}", daemon=True)
        self._thread.start()

    def submit(self, request: Any) -> Submission:
        if os.getpid() != self._owner_pid:
            raise BackendNotOwned(
                f"submissions to {self._name} belong to pid {self._owner_pid}; this is a fork of it"
            )
        future = Submission(self._interrupt_if_running)
        with self._lock:
            if self._closed:
                raise ScorerUnavailable(f"{self._name} is closed: nothing more can be submitted")
            try:
                self._queue.put_nowait((request, future))
            except queue.Full:
                raise SubmissionQueueFull(
                    f"{self._name}: {self._queue.maxsize} submissions are already waiting; "
                    f"collect some results first"
                ) from None
        return future

    def owned_here(self) -> bool:
        return os.getpid() == self._owner_pid

    @property
    def pending(self) -> int:
        return self._queue.qsize()

    def _run(self) -> None:
        while True:
            entry = self._queue.get()
            if entry is _STOP:
                return
            request, future = entry
            if not future.set_running_or_notify_cancel():
                continue  # cancelled while it waited: never sent
            with self._running_lock:
                self._running = future
            try:
                outcome = self._call(request)
            except BaseException as exc:  # noqa: BLE001 - the caller gets it from its own future
                outcome = Outcome.raised(exc)
            self._ran()
            future.settle(outcome)

    def _ran(self) -> None:
        with self._running_lock:
            self._running = None

    def _interrupt_if_running(self, future: Submission) -> None:
        """Interrupt the backend only while `future`'s own call is in flight (never the next
        one's)."""
        with self._running_lock:
            if self._running is future:
                self._interrupt()

    def close(self) -> None:
        """Fail what still waits (never sent) and stop the worker; the call in flight ends with the
        backend's own close (its child is stopped)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        while True:
            try:
                entry = self._queue.get_nowait()
            except queue.Empty:
                break
            if entry is not _STOP and entry[1].set_running_or_notify_cancel():
                closed = ScorerUnavailable(f"{self._name} was closed before this request was sent")
                entry[1].settle(Outcome.raised(closed))
        self._queue.put(_STOP)
