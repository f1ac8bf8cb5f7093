"""`WarmSandboxes`: sandboxes prepared ahead, a Runner whose runs skip the sandbox's own start.

A run takes a sandbox that bwrap has already built (its launcher waiting for the work) and
prepares its successor at once, in the background of the run: a completion pays about its
program's own start, the sandbox's (about half a cold run's wall time) is paid while the one
before it runs. Each sandbox still runs exactly one program: nothing of one run reaches the next.
Idle sandboxes hold no program of anyone's, only a waiting launcher; `close` kills them, and a
dead scorer's are killed by the kernel (their lifeline closes).
"""

from __future__ import annotations

import logging
import queue
import threading
from collections import deque
from collections.abc import Mapping, Sequence

from scorers.sandbox.results import Limits, RunResult, SandboxUnavailable
from scorers.sandbox.run import NO_FILES, PreparedSandbox, prepare, run_sandboxed

DEFAULT_LIMITS = Limits()
JOIN_S = 10.0
log = logging.getLogger(__name__)


class WarmSandboxes:
    """Keeps `size` sandboxes for `python` prepared (their tmpfs sized `tmpfs_bytes`). A run for
    another python or tmpfs size starts cold. Thread-safe; `close` is idempotent."""

    def __init__(self, python: str, size: int, tmpfs_bytes: int = DEFAULT_LIMITS.tmpfs_bytes):
        if size < 1:
            raise ValueError(f"a warm pool keeps at least one sandbox, got size={size}")
        self.python, self.size = python, size
        self._limits = Limits(tmpfs_bytes=tmpfs_bytes)
        self._ready: deque[PreparedSandbox] = deque()
        self._lock = threading.Lock()
        self._closed = False
        self._wanted: queue.SimpleQueue[bool] = queue.SimpleQueue()
        # bwrap dies with the thread that started it (PR_SET_PDEATHSIG): a grading thread ends
        # with its batch, so one thread that lives as long as the pool prepares them all
        self._preparer = threading.Thread(target=self._prepare, name="sandboxes", daemon=True)
        self._preparer.start()
        for _ in range(size):
            self._wanted.put(True)

    def run_sandboxed(
        self,
        argv: Sequence[str],
        *,
        python: str,
        stdin: bytes = b"",
        files: Mapping[str, bytes] = NO_FILES,
        limits: Limits = DEFAULT_LIMITS,
    ) -> RunResult:
        """`scorers.sandbox.run_sandboxed`, on a sandbox prepared ahead where one fits."""
        if self._closed:
            raise RuntimeError("the warm sandbox pool is closed")
        if python != self.python or limits.tmpfs_bytes != self._limits.tmpfs_bytes:
            return run_sandboxed(argv, python=python, stdin=stdin, files=files, limits=limits)
        sandbox = self._take()
        self._wanted.put(True)  # its successor builds while this one runs
        return sandbox.run(argv, stdin=stdin, files=files, limits=limits)

    def ready(self) -> int:
        """How many prepared sandboxes wait now."""
        with self._lock:
            return len(self._ready)

    def _take(self) -> PreparedSandbox:
        while True:
            with self._lock:
                if self._closed:
                    raise RuntimeError("the warm sandbox pool is closed")
                sandbox = self._ready.popleft() if self._ready else None
            if sandbox is None:  # none ready yet: this thread starts one and lives through its run
                return prepare(self.python, self._limits)
            if sandbox.alive:
                return sandbox
            sandbox.close()  # its bwrap exited while it waited: never hand out a dead one

    def _prepare(self) -> None:
        while self._wanted.get():
            try:
                sandbox = prepare(self.python, self._limits)
            except (OSError, SandboxUnavailable) as error:
                # a run finding none ready starts one itself, where this error is raised again
                log.warning("could not prepare a sandbox ahead for %s: %s", self.python, error)
                continue
            self._put(sandbox)

    def _put(self, sandbox: PreparedSandbox) -> None:
        with self._lock:
            if not self._closed and len(self._ready) < self.size:
                self._ready.append(sandbox)
                return
        sandbox.close()

    def close(self) -> None:
        """Kill every prepared sandbox; later runs raise."""
        with self._lock:
            self._closed = True
            waiting = list(self._ready)
            self._ready.clear()
        for sandbox in waiting:  # before their thread ends, which would kill their outer bwraps
            sandbox.close()
        self._wanted.put(False)
        self._preparer.join(timeout=JOIN_S)  # one prepare() in flight: a fork and an exec

    def __enter__(self) -> WarmSandboxes:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
