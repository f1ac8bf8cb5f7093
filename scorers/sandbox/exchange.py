"""The scorer's side of one sandbox while it runs: config and stdin in, output and status out,
the wall deadline and the output caps enforced by killing the sandbox whole."""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import subprocess
import time
from collections.abc import Callable

from scorers.sandbox.results import Limits, SandboxStuck

KILL_GRACE_S = 10.0  # a killed sandbox's pipes close and its bwrap exits within this
# a sandbox is stopped in order (its lifeline closed: pid 1 exits within its 20 ms watch, the
# kernel kills the namespace, each bwrap exits and is reaped by its parent, none left to init as
# a zombie); its bwraps' group is SIGKILLed only when that has not happened within this
STOP_GRACE_S = 1.0
OOM_WATCH_S = 0.05  # how often a sandbox's cgroup is read for an OOM kill while it runs


def close_lifeline(ends: dict[str, int]) -> None:
    """Close what keeps a sandbox's pid 1 waiting: its lifeline, and a config never sent."""
    for name in ("life_w", "cfg_w"):
        with contextlib.suppress(KeyError):
            os.close(ends.pop(name))


def kill_group(process: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)


READ = 1 << 16


class Exchange:
    """Feeds and drains one sandbox; `killed_for` says why the scorer killed it, if it did.
    `oom_killed`: whether the kernel killed one of its processes for its cgroup's memory limit (read
    every OOM_WATCH_S while it runs): the whole sandbox is then killed, as "memory"."""

    def __init__(
        self,
        process: subprocess.Popen[bytes],
        ends: dict[str, int],
        limits: Limits,
        started: float,
        oom_killed: Callable[[], bool] | None = None,
    ) -> None:
        self.process = process
        self.oom_killed = oom_killed
        self.ends = ends
        self.limits = limits
        self.deadline = started + limits.wall_s
        self.out: dict[str, bytearray] = {"stdout": bytearray(), "stderr": bytearray()}
        self.truncated: dict[str, bool] = {"stdout": False, "stderr": False}
        self.status = bytearray()
        self.killed_for: str | None = None
        self.killed_at = 0.0
        self.forced = False
        self.returncode: int | None = None

    def run(self, config: bytes, stdin: bytes) -> None:
        assert self.process.stdin and self.process.stdout and self.process.stderr
        pending = {
            self.ends["cfg_w"]: memoryview(config),
            self.process.stdin.fileno(): memoryview(stdin),
        }
        readers = {
            self.process.stdout.fileno(): "stdout",
            self.process.stderr.fileno(): "stderr",
            self.ends["status_r"]: "status",
        }
        with selectors.DefaultSelector() as selector:
            for fd in pending:
                os.set_blocking(fd, False)
                selector.register(fd, selectors.EVENT_WRITE)
            for fd in readers:
                selector.register(fd, selectors.EVENT_READ)
            self._loop(selector, pending, readers)
        self._close_writers(pending)
        self._reap()

    def _loop(self, selector: selectors.BaseSelector, pending: dict, readers: dict) -> None:
        while readers:
            now = time.monotonic()
            if now >= self.deadline and self.killed_for is None:
                self.kill("timeout")
            if self.killed_for is None and self.oom_killed is not None and self.oom_killed():
                self.kill("memory")
            left = self.deadline - now
            if self.oom_killed is not None:
                left = min(left, OOM_WATCH_S)
            if self.killed_for is not None:
                since = now - self.killed_at
                if since >= STOP_GRACE_S:
                    self.force()
                if since >= KILL_GRACE_S:
                    return  # output still open after the kill: _reap decides
                left = (STOP_GRACE_S if since < STOP_GRACE_S else KILL_GRACE_S) - since
            for key, _ in selector.select(max(left, 0.0)):
                fd = key.fd
                if fd in pending:
                    self._write(selector, pending, fd)
                else:
                    self._read(selector, readers, fd)

    def _write(self, selector: selectors.BaseSelector, pending: dict, fd: int) -> None:
        data = pending[fd]
        try:
            sent = os.write(fd, data[: 1 << 16]) if data else 0
        except BrokenPipeError:
            sent, data = 0, b""  # the program closed its stdin, or the sandbox is gone
        if len(data) - sent <= 0:
            selector.unregister(fd)
            self._close_writer(pending, fd)
        else:
            pending[fd] = data[sent:]

    def _read(self, selector: selectors.BaseSelector, readers: dict, fd: int) -> None:
        name = readers[fd]
        chunk = os.read(fd, READ)
        if not chunk:
            selector.unregister(fd)
            del readers[fd]
            return
        if name in self.out:
            room = self.limits.output_bytes - len(self.out[name])
            self.out[name] += chunk[: max(room, 0)]
            if len(chunk) > room and self.killed_for is None:
                self.truncated[name] = True
                self.kill("output_limit")
        elif name == "status":
            self.status += chunk

    def _close_writer(self, pending: dict, fd: int) -> None:
        del pending[fd]
        if fd == self.ends.get("cfg_w"):
            os.close(self.ends.pop("cfg_w"))
        elif self.process.stdin is not None:
            with contextlib.suppress(BrokenPipeError):
                self.process.stdin.close()

    def _close_writers(self, pending: dict) -> None:
        for fd in list(pending):
            self._close_writer(pending, fd)

    def kill(self, why: str) -> None:
        """Kill the sandbox whole: the lifeline closes (pid 1 exits, the kernel kills its PID
        namespace); past STOP_GRACE_S the bwraps' group is SIGKILLed (`force`)."""
        self.killed_for = why
        self.killed_at = time.monotonic()
        close_lifeline(self.ends)

    def force(self) -> None:
        """SIGKILL the bwraps' group (pid 1 dies with its bwrap), once."""
        if not self.forced:
            self.forced = True
            kill_group(self.process)

    def _reap(self) -> None:
        try:
            self.returncode = self.process.wait(timeout=KILL_GRACE_S)
        except subprocess.TimeoutExpired:
            if self.killed_for is None:
                self.kill("stuck")
            self.force()
            try:
                self.returncode = self.process.wait(timeout=KILL_GRACE_S)
            except subprocess.TimeoutExpired as error:
                raise SandboxStuck(
                    f"the sandbox's bwrap (pid {self.process.pid}) did not exit within "
                    f"{KILL_GRACE_S:.0f} s of SIGKILL ({self.killed_for})"
                ) from error
        for stream in (self.process.stdout, self.process.stderr):
            if stream is not None:
                stream.close()
