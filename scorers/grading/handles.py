"""The one type through which scorers/grading signals and reaps a process: `GradingProcess`.

Why one type: a signal sent to a pid that someone already reaped may hit a stranger that reused it.
Each kind of process the pool starts knows when that can no longer happen, and says so in one place
(`_gone`); `signal()` sends nothing after it, and `reap()` waits (always bounded) for the exit.
Kinds:
- `SpawnedProcess`: a multiprocessing Process the forkserver started (a worker, or the template);
- `ClonedProcess`: a worker the template forked: not our child, watched through a pidfd (poll it,
  signal it without racing pid reuse), its exit status told by the template, which reaps it;
- `HelperProcess`: one of multiprocessing's helpers, reaped by multiprocessing's own `_stop()` in a
  thread.
"""

from __future__ import annotations

import abc
import os
import signal
import threading
import time
from multiprocessing import connection as mp_connection
from typing import Any, Protocol

from scorers.grading.errors import GradingPoolError


class GradingProcess(abc.ABC):
    """A process some part of the pool started: `signal()` it, `reap()` it; nothing else sends it a
    signal."""

    pid: int

    def signal(self, signum: int) -> None:
        """Send `signum`, unless it is known to be gone (a reaped pid may belong to someone else by
        now)."""
        if self._gone():
            return
        try:
            self._deliver(signum)
        except ProcessLookupError:
            pass  # it exited on its own: its sentinel (or its reaper) says so on the next look

    def kill(self) -> None:
        self.signal(signal.SIGKILL)

    @abc.abstractmethod
    def reap(self, timeout_s: float) -> bool:
        """Wait at most `timeout_s` for it to exit, then release what watches it; True once it is
        gone."""

    @abc.abstractmethod
    def _gone(self) -> bool:
        """Known to have exited (or no longer ours to watch): never signal it again."""

    @abc.abstractmethod
    def _deliver(self, signum: int) -> None: ...


class WorkerProcess(GradingProcess):
    """A grading process the pool waits on: its sentinel, its exit status once known."""

    @property
    @abc.abstractmethod
    def sentinel(self) -> int: ...

    @property
    @abc.abstractmethod
    def exitcode(self) -> int | None: ...

    @abc.abstractmethod
    def is_alive(self) -> bool: ...

    @abc.abstractmethod
    def wait_status(self, timeout_s: float) -> int | None:
        """Wait at most `timeout_s` until it has exited and its exit status is known; return it."""


class SpawnedProcess(WorkerProcess):
    """A multiprocessing Process started by the forkserver; multiprocessing reads its exit
    status."""

    def __init__(self, process: Any) -> None:
        if process.pid is None:  # start() returned, so it has one; the type does not say so
            raise GradingPoolError(f"{process.name} started without a pid")
        self._process = process
        self.pid: int = process.pid
        self._sentinel: int = process.sentinel  # cached: a closed Process no longer tells it
        self._closed = False

    @property
    def sentinel(self) -> int:
        return self._sentinel

    @property
    def exitcode(self) -> int | None:
        return None if self._closed else self._process.exitcode

    def is_alive(self) -> bool:
        return not self._closed and self._process.is_alive()

    def wait_status(self, timeout_s: float) -> int | None:
        if not self._closed:
            self._process.join(timeout_s)
        return self.exitcode

    def reap(self, timeout_s: float) -> bool:
        if self._closed:
            return True
        self._process.join(timeout_s)
        if self._process.is_alive():
            return False
        self._process.close()
        self._closed = True
        return True

    def _gone(self) -> bool:
        # exitcode polls: never a reaped pid
        return self._closed or self._process.exitcode is not None

    def _deliver(self, signum: int) -> None:
        os.kill(self.pid, signum)


class CloneReaper(Protocol):
    """What a cloned worker needs of the template that forked (and reaps) it."""

    def status_of(self, pid: int) -> int | None: ...

    def await_status(self, pid: int, deadline: float) -> None: ...

    def forget(self, pid: int) -> None: ...


class ClonedProcess(WorkerProcess):
    """A worker the template forked, over the pidfd the template opened before it could reap it."""

    def __init__(self, pid: int, pidfd: int, reaper: CloneReaper) -> None:
        self.pid = pid
        self._pidfd = pidfd
        self._reaper = reaper

    @property
    def sentinel(self) -> int:
        return self._pidfd

    @property
    def exitcode(self) -> int | None:
        return None if self._pidfd < 0 else self._reaper.status_of(self.pid)

    def is_alive(self) -> bool:
        # poll(2): a pidfd may be numbered past select's 1024
        return self._pidfd >= 0 and not mp_connection.wait([self._pidfd], 0)

    def wait_status(self, timeout_s: float) -> int | None:
        """Wait until it has exited and the template has told its exit status (both bounded by
        `timeout_s`)."""
        deadline = time.monotonic() + timeout_s
        if self._pidfd >= 0 and mp_connection.wait([self._pidfd], timeout_s):
            self._reaper.await_status(self.pid, deadline)
        return self.exitcode

    def reap(self, timeout_s: float) -> bool:
        if self._pidfd < 0:
            return True
        self.wait_status(timeout_s)
        if self.is_alive():
            return False
        os.close(self._pidfd)
        self._pidfd = -1
        self._reaper.forget(self.pid)
        return True

    def _gone(self) -> bool:
        return self._pidfd < 0  # the pidfd names this process only, exited or not

    def _deliver(self, signum: int) -> None:
        signal.pidfd_send_signal(self._pidfd, signum)


class HelperProcess(GradingProcess):
    """A multiprocessing helper (forkserver, resource tracker) being stopped by `stopper`, a thread
    running multiprocessing's own `_stop()`: it reaps the helper, so the helper is ours to signal
    until that thread is done."""

    def __init__(self, pid: int, stopper: threading.Thread) -> None:
        self.pid = pid
        self._stopper = stopper

    def reap(self, timeout_s: float) -> bool:
        self._stopper.join(timeout_s)
        return not self._stopper.is_alive()

    def _gone(self) -> bool:
        return not self._stopper.is_alive()

    def _deliver(self, signum: int) -> None:
        os.kill(self.pid, signum)
