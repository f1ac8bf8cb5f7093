"""ChildProcess: the one owner of one scorer child (spawn, readiness, signals, reaping).

The parent binds 127.0.0.1:0 itself and hands the listening fd to the child, so
there is no port race; readiness arrives as one JSON line on a pipe, and EOF on
that pipe means the child died while starting. Every wait has a deadline.
"""
from __future__ import annotations

import json
import logging
import os
import secrets
import selectors
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from supervisor.errors import ChildRecord, ScorerStartupError
from supervisor.logs import open_child_log, read_tail

log = logging.getLogger(__name__)

REAP_GRACE_S = 2.0


@dataclass(frozen=True)
class LaunchPlan:
    """Everything needed to start one child; built by the backend from its spec."""

    name: str
    python_executable: Path
    service_root: Path
    boot: dict[str, Any]
    env: dict[str, str]
    log_dir: Path | None
    rank: int | None
    startup_timeout: float


def _read_ready_line(fd: int, deadline: float) -> bytes | None:
    """Bytes up to the first newline, or None on EOF; TimeoutError at the deadline."""
    data = b""
    with selectors.DefaultSelector() as selector:
        selector.register(fd, selectors.EVENT_READ)
        while b"\n" not in data:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not selector.select(remaining):
                raise TimeoutError
            chunk = os.read(fd, 65536)
            if not chunk:
                return None
            data += chunk
    return data.split(b"\n", 1)[0]


class ChildProcess:
    def __init__(self, plan: LaunchPlan) -> None:
        self.plan = plan
        self.token = secrets.token_urlsafe(32)
        self.proc: subprocess.Popen | None = None
        self.log_path: Path | None = None
        self.port: int | None = None
        self.ready_info: dict[str, Any] = {}
        self.spawned_at: float | None = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def record(self) -> ChildRecord:
        returncode = self.proc.poll() if self.proc else None
        return ChildRecord(self.plan.name, self.pid, returncode, str(self.log_path), read_tail(self.log_path))

    def start(self) -> dict[str, Any]:
        """Spawn and wait for readiness; on any failure the child is killed and reaped."""
        if self.proc is not None:
            raise RuntimeError(f"child {self.plan.name!r} was already started (pid {self.pid})")
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        ready_r, ready_w = os.pipe()
        try:
            listener.bind(("127.0.0.1", 0))
            listener.listen(1024)
            self.port = listener.getsockname()[1]
            self._spawn(listener.fileno(), ready_w)
        finally:
            listener.close()  # the child has its own copy; ours would keep a dead port connectable
            os.close(ready_w)
        try:
            return self._await_ready(ready_r)
        except BaseException:
            self.kill_group()
            self.reap(REAP_GRACE_S)
            raise
        finally:
            os.close(ready_r)

    def _spawn(self, listen_fd: int, ready_w: int) -> None:
        log_fd, self.log_path = open_child_log(self.plan.log_dir, self.plan.name, self.plan.rank)
        boot = {**self.plan.boot, "token": self.token, "listen_fd": listen_fd, "ready_fd": ready_w,
                "parent_pid": os.getpid()}
        try:
            self.spawned_at = time.monotonic()
            self.proc = subprocess.Popen(
                [str(self.plan.python_executable), "-X", "faulthandler", "-m", "child_runtime"],
                stdin=subprocess.PIPE, stdout=log_fd, stderr=subprocess.STDOUT,
                cwd=self.plan.service_root, env=self.plan.env, start_new_session=True,
                pass_fds=(listen_fd, ready_w), close_fds=True,
            )
        finally:
            os.close(log_fd)
        try:
            self.proc.stdin.write(json.dumps(boot).encode())
            self.proc.stdin.close()
        except BrokenPipeError:
            pass  # the child died before reading its config; readiness reports how

    def _await_ready(self, ready_r: int) -> dict[str, Any]:
        deadline = self.spawned_at + self.plan.startup_timeout
        try:
            line = _read_ready_line(ready_r, deadline)
        except TimeoutError:
            raise ScorerStartupError(
                f"child not ready within startup_timeout={self.plan.startup_timeout} s", self._killed_record()
            ) from None
        if line is None:
            self.reap(REAP_GRACE_S)
            raise ScorerStartupError("child exited while starting", self.record())
        message = json.loads(line)
        if not message.get("ready"):
            self.reap(REAP_GRACE_S)
            raise ScorerStartupError(f"child failed to boot: {message.get('error', '?')}", self.record())
        message["spawn_to_ready_s"] = time.monotonic() - self.spawned_at
        self.ready_info = message
        return message

    def _killed_record(self) -> ChildRecord:
        self.kill_group()
        self.reap(REAP_GRACE_S)
        return self.record()

    def poll(self) -> int | None:
        return self.proc.poll() if self.proc else None

    def reap(self, timeout: float) -> int | None:
        """Wait up to `timeout` for the child to exit; returns its returncode or None."""
        if self.proc is None:
            return None
        try:
            return self.proc.wait(timeout=max(0.0, timeout))
        except subprocess.TimeoutExpired:
            return None

    def signal_group(self, signum: int) -> None:
        """Signal the child's whole process group (it is the group leader)."""
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signum)
        except ProcessLookupError:
            pass

    def kill_group(self) -> None:
        self.signal_group(signal.SIGKILL)

    def stop(self, graceful_s: float, term_s: float = 2.0, kill_s: float = 2.0) -> ChildRecord:
        """Bounded escalation after a graceful request: wait, SIGTERM, SIGKILL, reap."""
        if self.proc is None:
            raise RuntimeError(f"child {self.plan.name!r} was never started")
        if self.reap(graceful_s) is None:
            self.signal_group(signal.SIGTERM)
            if self.reap(term_s) is None:
                log.warning("child %s pid %s ignored SIGTERM; sending SIGKILL", self.plan.name, self.pid)
        self.kill_group()  # also takes descendants (forkservers, workers) that outlived the leader
        if self.reap(kill_s) is None:
            log.error("child %s pid %s did not die after SIGKILL; leaving it", self.plan.name, self.pid)
        return self.record()
