"""ChildProcess: the one owner of one scorer child (spawn, readiness, signals, reaping).

The parent binds 127.0.0.1:0 itself and hands the listening fd to the child, so
there is no port race; readiness arrives as one JSON line on a pipe, and EOF on
that pipe means the child died while starting. Exit is observed through a pidfd
without reaping, so the process group is always killed while the leader's pid
(and so the group id) is still reserved: a late killpg never hits a reused pid.
Every wait has a deadline.
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
import threading
import time
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from supervisor.errors import ChildRecord, ScorerStartupError
from supervisor.logs import open_child_log, read_tail

log = logging.getLogger(__name__)

REAP_GRACE_S = 2.0
MAX_BOOT_CONFIG_BYTES = 16 * 1024 * 1024


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
    pass_fds: tuple[int, ...] = ()  # e.g. the data-plane segment; inherited by this child only


def _wait_fd(fd: int, events: int, deadline: float) -> bool:
    """Wait until `fd` is ready for `events`; False at the deadline."""
    with selectors.DefaultSelector() as selector:
        selector.register(fd, events)
        return bool(selector.select(max(0.0, deadline - time.monotonic())))


def _read_ready_line(fd: int, deadline: float) -> bytes | None:
    """Bytes up to the first newline, or None on EOF; TimeoutError at the deadline."""
    data = b""
    while b"\n" not in data:
        if not _wait_fd(fd, selectors.EVENT_READ, deadline):
            raise TimeoutError
        chunk = os.read(fd, 65536)
        if not chunk:
            return None
        data += chunk
    return data.split(b"\n", 1)[0]


def _write_all(fd: int, data: bytes, deadline: float) -> bool:
    """Write `data` to a non-blocking pipe against a deadline; False if the reader went away."""
    os.set_blocking(fd, False)
    view = memoryview(data)
    while view:
        if not _wait_fd(fd, selectors.EVENT_WRITE, deadline):
            raise TimeoutError
        try:
            view = view[os.write(fd, view):]
        except BlockingIOError:
            continue
        except BrokenPipeError:
            return False
    return True


class ChildProcess:
    def __init__(self, plan: LaunchPlan) -> None:
        self.plan = plan
        self.token = secrets.token_urlsafe(32)
        self.proc: subprocess.Popen | None = None
        self.pidfd: int | None = None
        self.log_path: Path | None = None
        self.port: int | None = None
        self.ready_info: dict[str, Any] = {}
        self.spawned_at: float | None = None
        self._reap_lock = threading.Lock()  # a signal and the reap never interleave: no pid reuse

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    # -- observing --------------------------------------------------------------------------
    def returncode(self) -> int | None:
        """The exit status if the child has exited, without reaping it."""
        if self.proc is None or self.proc.returncode is not None:
            return self.proc.returncode if self.proc else None
        try:
            info = os.waitid(os.P_PID, self.proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:  # reaped behind our back (SIGCHLD ignored): Popen knows no better
            return self.proc.poll()
        if info is None or info.si_pid == 0:
            return None
        return info.si_status if info.si_code == os.CLD_EXITED else -info.si_status

    def wait_exit(self, timeout: float) -> bool:
        """True once the child has exited (still unreaped); waits on its pidfd, not by polling."""
        if self.proc is None:
            return True
        if self.proc.returncode is not None:
            return True
        return _wait_fd(self.pidfd, selectors.EVENT_READ, time.monotonic() + timeout) and \
            self.returncode() is not None

    def record(self) -> ChildRecord:
        return ChildRecord(self.plan.name, self.pid, self.returncode(), str(self.log_path), read_tail(self.log_path))

    # -- starting ---------------------------------------------------------------------------
    def start(self) -> dict[str, Any]:
        """Spawn and wait for readiness; on any failure the child's group is killed and reaped."""
        if self.proc is not None:
            raise RuntimeError(f"child {self.plan.name!r} was already started (pid {self.pid})")
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        ready_r, ready_w = os.pipe()
        try:
            listener.bind(("127.0.0.1", 0))
            listener.listen(1024)
            self.port = listener.getsockname()[1]
            self._spawn(listener.fileno(), ready_w)
            os.close(ready_w)
            ready_w = -1
            self._send_boot_config()
            return self._await_ready(ready_r)
        except BaseException:
            self.finish()
            raise
        finally:
            listener.close()  # the child has its own copy; ours would keep a dead port connectable
            os.close(ready_r)
            if ready_w >= 0:
                os.close(ready_w)

    def _spawn(self, listen_fd: int, ready_w: int) -> None:
        log_fd, self.log_path = open_child_log(self.plan.log_dir, self.plan.name, self.plan.rank)
        try:
            self.spawned_at = time.monotonic()
            self.proc = subprocess.Popen(
                [str(self.plan.python_executable), "-X", "faulthandler", "-m", "child_runtime"],
                stdin=subprocess.PIPE, stdout=log_fd, stderr=subprocess.STDOUT,
                cwd=self.plan.service_root, env=self.plan.env, start_new_session=True,
                pass_fds=(listen_fd, ready_w, *self.plan.pass_fds), close_fds=True,
            )
        except OSError as exc:
            raise ScorerStartupError(
                f"cannot execute {self.plan.python_executable}: {exc}",
                ChildRecord(self.plan.name, None, None, str(self.log_path), read_tail(self.log_path)),
            ) from exc
        finally:
            os.close(log_fd)
        self.pidfd = os.pidfd_open(self.proc.pid)
        weakref.finalize(self, os.close, self.pidfd)  # never earlier: another thread may be waiting on it
        self._boot = {**self.plan.boot, "token": self.token, "listen_fd": listen_fd, "ready_fd": ready_w,
                      "parent_pid": os.getpid()}

    def _send_boot_config(self) -> None:
        data = json.dumps(self._boot).encode()
        if len(data) > MAX_BOOT_CONFIG_BYTES:
            raise ScorerStartupError(f"boot config is {len(data)} bytes (limit {MAX_BOOT_CONFIG_BYTES})",
                                     self._killed_record())
        deadline = self.spawned_at + self.plan.startup_timeout
        try:
            _write_all(self.proc.stdin.fileno(), data, deadline)  # a dead reader is reported by readiness
        except TimeoutError:
            raise ScorerStartupError(
                f"child did not read its boot config within startup_timeout={self.plan.startup_timeout} s",
                self._killed_record(),
            ) from None
        finally:
            self.proc.stdin.close()

    def _await_ready(self, ready_r: int) -> dict[str, Any]:
        deadline = self.spawned_at + self.plan.startup_timeout
        try:
            line = _read_ready_line(ready_r, deadline)
        except TimeoutError:
            raise ScorerStartupError(
                f"child not ready within startup_timeout={self.plan.startup_timeout} s", self._killed_record()
            ) from None
        if line is None:
            self.wait_exit(REAP_GRACE_S)
            raise ScorerStartupError("child exited while starting", self.finish())
        try:
            message = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ScorerStartupError(f"unreadable readiness line {line[:200]!r}", self._killed_record()) from exc
        if not message.get("ready"):
            self.wait_exit(REAP_GRACE_S)
            raise ScorerStartupError(f"child failed to boot: {message.get('error', '?')}", self.finish())
        message["spawn_to_ready_s"] = time.monotonic() - self.spawned_at
        self.ready_info = message
        return message

    def _killed_record(self) -> ChildRecord:
        self.signal_group(signal.SIGKILL)
        self.wait_exit(REAP_GRACE_S)
        return self.finish()

    # -- stopping ---------------------------------------------------------------------------
    def signal_group(self, signum: int) -> None:
        """Signal the child's whole process group; only while its leader is unreaped."""
        with self._reap_lock:
            if self.proc is None or self.proc.returncode is not None:
                return
            try:
                os.killpg(self.proc.pid, signum)
            except ProcessLookupError:
                pass

    def finish(self) -> ChildRecord:
        """SIGKILL whatever is left of the group (forkservers, workers), then reap. Bounded."""
        if self.proc is None:
            return self.record()
        self.signal_group(signal.SIGKILL)
        try:
            with self._reap_lock:
                self.proc.wait(timeout=REAP_GRACE_S)
        except subprocess.TimeoutExpired:
            log.error("child %s pid %s did not die after SIGKILL; leaving it", self.plan.name, self.pid)
        return self.record()

    def stop(self, graceful_s: float, term_s: float = 2.0) -> ChildRecord:
        """Bounded escalation after a graceful request: wait, SIGTERM the group, wait, finish."""
        if self.proc is None:
            return self.record()
        if not self.wait_exit(graceful_s):
            self.signal_group(signal.SIGTERM)
            if not self.wait_exit(term_s):
                log.warning("child %s pid %s ignored SIGTERM; sending SIGKILL", self.plan.name, self.pid)
        return self.finish()
