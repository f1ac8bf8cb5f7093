"""ChildProcess: the one owner of one scorer child (spawn, readiness, signals, reaping).

The child is started by posix_spawn (`supervisor.child.spawn`: no pipe a fork of the trainer
can hold). The parent binds 127.0.0.1:0 itself and hands the listening fd to the child, so
there is no port race; the boot config goes framed on stdin; readiness arrives
as one JSON line on a pipe, and EOF on that pipe means the child died while
starting. Exit is observed through a pidfd without reaping, so the process group
is killed while the leader's pid (and so the group id) is still reserved: a late
killpg never hits a reused pid. Every wait has a deadline.

Only the process that spawned the child acts on it. In a fork of the trainer
(a DataLoader worker, a checkpoint writer) every signal and reap here is a
no-op, and so is the kill-at-exit finalizer that guards against an owner that
never called close().

Exit statuses come from waitid, or, when the trainer ignores SIGCHLD and the
kernel reaps the child at once, from its pidfd (Linux 6.15+ keeps it there);
never from a wait that reports a child reaped elsewhere as "exit 0". A child
reaped elsewhere is never signalled again (its pid may be reused at once); the
rest of its group dies through its own lifelines.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import secrets
import selectors
import signal
import socket
import struct
import threading
import time
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from child_runtime.protocol import boot
from scorers.early import early_args
from supervisor.child.logs import open_child_log, read_tail
from supervisor.child.spawn import spawn_child
from supervisor.errors import ChildRecord, ScorerStartupError

log = logging.getLogger(__name__)

REAP_GRACE_S = 2.0


@dataclass(frozen=True)
class LaunchPlan:
    """Everything needed to start one child; built by the backend from its spec."""

    name: str
    python_executable: Path
    boot: dict[str, Any]
    env: dict[str, str]
    cwd: Path
    log_dir: Path | None
    keep_logs: int
    rank: int | None
    startup_timeout: float
    pass_fds: tuple[int, ...] = ()  # e.g. the data-plane segment; inherited by this child only


def _wait_fds(fds: list[int], events: int, deadline: float) -> list[int]:
    """The descriptors of `fds` ready for `events`; [] at the deadline."""
    with selectors.DefaultSelector() as selector:
        for fd in fds:
            selector.register(fd, events)
        return [key.fd for key, _ in selector.select(max(0.0, deadline - time.monotonic()))]


def _wait_fd(fd: int, events: int, deadline: float) -> bool:
    """Wait until `fd` is ready for `events`; False at the deadline."""
    return bool(_wait_fds([fd], events, deadline))


def _read_ready_line(fd: int, pidfd: int | None, deadline: float) -> bytes | None:
    """Bytes up to the first newline; None on EOF, or once the child has exited without a whole line
    (a process forked from the trainer may hold the pipe's write end, so EOF may never come);
    TimeoutError at the deadline."""
    data = b""
    watched = [fd] if pidfd is None else [fd, pidfd]
    while b"\n" not in data:
        ready = _wait_fds(watched, selectors.EVENT_READ, deadline)
        if not ready:
            raise TimeoutError
        if fd not in ready:  # exited: whatever it wrote before it went is in the pipe already
            os.set_blocking(fd, False)
            try:
                data += os.read(fd, 65536)
            except BlockingIOError:
                pass
            return data.split(b"\n", 1)[0] if b"\n" in data else None
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
            view = view[os.write(fd, view) :]
        except BlockingIOError:
            continue
        except BrokenPipeError:
            return False
    return True


def _decode_wait_status(status: int) -> int:
    """A raw wait status as a Popen-style returncode: the exit code, or minus the signal."""
    return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


# _IOWR(PIDFS_IOCTL_MAGIC, 11, struct pidfd_info)
_PIDFD_GET_INFO = (3 << 30) | (64 << 16) | (0xFF << 8) | 11
_PIDFD_INFO_EXIT = 1 << 3
# struct pidfd_info: mask, cgroupid (u64), then u32 pid .. fsgid (11), then s32 exit_code
_EXIT_CODE_OFFSET = 60


def pidfd_exit_status(pidfd: int) -> int | None:
    """The exit status the kernel kept on a pidfd for a process already reaped (Linux 6.15+), or
    None."""
    info = bytearray(64)
    struct.pack_into("<Q", info, 0, _PIDFD_INFO_EXIT)
    try:
        fcntl.ioctl(pidfd, _PIDFD_GET_INFO, info, True)
    except OSError:
        return None  # an older kernel, or the process was reaped before the pidfd existed
    if not struct.unpack_from("<Q", info, 0)[0] & _PIDFD_INFO_EXIT:
        return None
    return _decode_wait_status(struct.unpack_from("<i", info, _EXIT_CODE_OFFSET)[0])


def _kill_group_at_exit(pid: int, owner_pid: int) -> None:
    """Last resort if the owner is collected or the interpreter exits without close(); never in a
    fork."""
    if os.getpid() != owner_pid:
        return
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


class ChildProcess:
    def __init__(self, plan: LaunchPlan) -> None:
        self.plan = plan
        self.token = secrets.token_urlsafe(32)
        self.owner_pid = os.getpid()
        self.log_path: Path | None = None
        self.port: int | None = None
        self.ready_info: dict[str, Any] = {}
        self.spawned_at: float | None = None
        self._pid: int | None = None
        # our end of the child's stdin until the boot config is written
        self._stdin: int | None = None
        self._pidfd: int | None = None
        self._exited = False
        self._status: int | None = None  # Popen-style returncode once known
        # by us or by anyone: from then on its pid may belong to another process
        self._reaped = False
        self._at_exit: weakref.finalize | None = None
        self._lock = threading.Lock()  # a signal and the reap never interleave: no pid reuse
        self._aborted = False  # abort() was called: a child spawned after it is killed at once

    @property
    def pid(self) -> int | None:
        return self._pid

    @property
    def owned(self) -> bool:
        """True in the process that spawned the child (not in a fork of it)."""
        return os.getpid() == self.owner_pid

    # -- observing --------------------------------------------------------------------------
    def returncode(self) -> int | None:
        """The exit status once the child has exited (negative: the signal), without reaping it;
        None while it runs, or when its status was lost (see `exited`)."""
        self._observe()
        return self._status

    def exited(self) -> bool:
        self._observe()
        return self._exited

    def _observe(self) -> None:
        if self._exited or self._pid is None:
            return
        with self._lock:
            if self._exited:
                return
            try:
                info = os.waitid(os.P_PID, self._pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            # already reaped: SIGCHLD is ignored here, or someone else waited
            except ChildProcessError:
                if self._pidfd is None or _wait_fd(self._pidfd, selectors.EVENT_READ, 0):
                    # its pid is free for reuse: never signal that group again; what is left of the
                    # group dies through its own lifelines (the forkserver's pipe, PDEATHSIG)
                    self._exited = self._reaped = True
                    self._status = None if self._pidfd is None else pidfd_exit_status(self._pidfd)
                    if self._at_exit is not None:
                        self._at_exit.detach()
                return
            if info is None or info.si_pid == 0:
                return
            self._exited = True
            self._status = info.si_status if info.si_code == os.CLD_EXITED else -info.si_status

    def wait_exit(self, timeout: float) -> bool:
        """True once the child has exited (still unreaped); waits on its pidfd (polls only where
        there is none)."""
        if self._pid is None or self.exited():
            return True
        deadline = time.monotonic() + timeout
        # no pidfd (a sandbox without pidfd_open, like gVisor's older ones): poll
        if self._pidfd is None:
            while not self.exited() and time.monotonic() < deadline:
                time.sleep(0.01)
            return self.exited()
        _wait_fd(self._pidfd, selectors.EVENT_READ, deadline)
        return self.exited()

    def record(self) -> ChildRecord:
        return ChildRecord(
            self.plan.name,
            self.pid,
            self.returncode(),
            str(self.log_path),
            read_tail(self.log_path),
            exited=self._exited,
            rank=self.plan.rank,
        )

    # -- starting ---------------------------------------------------------------------------
    def start(self) -> dict[str, Any]:
        """Spawn and wait for readiness; on any failure the child's group is killed and reaped."""
        if self._pid is not None:
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
            if self._stdin is not None:  # the boot config was never written
                os.close(self._stdin)
                self._stdin = None
            os.close(ready_r)
            if ready_w >= 0:
                os.close(ready_w)

    def _spawn(self, listen_fd: int, ready_w: int) -> None:
        """Start the child on its log, watch for its exit, and keep the boot config it is sent."""
        log_fd = self._open_log()
        pid, numbers = self._exec(log_fd, (listen_fd, ready_w, *self.plan.pass_fds))
        # abort() came while the spawn ran: the boot it wanted stopped never starts
        if self._aborted:
            self.signal_group(signal.SIGKILL)
        self._at_exit = weakref.finalize(self, _kill_group_at_exit, pid, self.owner_pid)
        self._open_pidfd(pid)
        shared = self.plan.boot.get("shared_fd")
        self._boot = {
            **self.plan.boot,
            "token": self.token,
            "listen_fd": numbers[listen_fd],
            "ready_fd": numbers[ready_w],
            "shared_fd": None if shared is None else numbers[shared],
            "parent_pid": os.getpid(),
            "cwd": str(self.plan.cwd),  # posix_spawn cannot chdir: the child does, first thing
        }

    def _open_log(self) -> int:
        """The child's log file, its descriptor ours to close; ScorerStartupError if it cannot be
        made."""
        try:
            log_fd, self.log_path = open_child_log(
                self.plan.log_dir, self.plan.name, self.plan.rank, self.plan.keep_logs
            )
        except OSError as exc:
            raise ScorerStartupError(
                f"cannot create the child's log file: {exc}",
                ChildRecord(self.plan.name, None, rank=self.plan.rank),
            ) from exc
        return log_fd

    def _exec(self, log_fd: int, pass_fds: tuple[int, ...]) -> tuple[int, dict[int, int]]:
        """Spawns the child runtime (`log_fd` closed after, whatever happens): its pid, and the
        number each passed descriptor has in the child."""
        try:
            self.spawned_at = time.monotonic()
            self._pid, self._stdin, numbers = spawn_child(
                [
                    str(self.plan.python_executable),
                    *("-X", "faulthandler", "-m", "child_runtime"),
                    *early_args(str((self.plan.boot.get("scorer") or {}).get("name", ""))),
                ],
                self.plan.env,
                log_fd,
                pass_fds,
            )
        # NotImplementedError: no POSIX_SPAWN_SETSID (glibc < 2.26)
        except (OSError, NotImplementedError) as exc:
            raise ScorerStartupError(
                f"cannot execute {self.plan.python_executable} in {self.plan.cwd}: {exc}",
                ChildRecord(
                    self.plan.name,
                    None,
                    None,
                    str(self.log_path),
                    read_tail(self.log_path),
                    rank=self.plan.rank,
                ),
            ) from exc
        finally:
            os.close(log_fd)
        return self._pid, numbers

    def _open_pidfd(self, pid: int) -> None:
        """A pidfd to wait on the child's exit; without one, its exit is polled."""
        try:
            self._pidfd = os.pidfd_open(pid)
            # never earlier: another thread may be waiting on it
            weakref.finalize(self, os.close, self._pidfd)
        except ProcessLookupError:
            pass  # already exited and reaped by the kernel (SIGCHLD ignored): its status is lost
        # ENOSYS: no pidfd_open here; exits are then observed by waitid polling
        except OSError as exc:
            log.warning(
                "no pidfd for child %s pid %s (%s): its exit is polled",
                self.plan.name,
                pid,
                exc,
            )

    def _send_boot_config(self) -> None:
        assert self._stdin is not None and self.spawned_at is not None
        try:
            data = boot.frame(self._boot)
        except ValueError as exc:
            raise ScorerStartupError(str(exc), self._killed_record()) from exc
        deadline = self.spawned_at + self.plan.startup_timeout
        try:
            _write_all(self._stdin, data, deadline)  # a dead reader is reported by readiness
        except TimeoutError:
            raise ScorerStartupError(
                f"child did not read its boot config within "
                f"startup_timeout={self.plan.startup_timeout} s",
                self._killed_record(),
            ) from None
        finally:
            os.close(self._stdin)
            self._stdin = None

    def _await_ready(self, ready_r: int) -> dict[str, Any]:
        assert self.spawned_at is not None
        deadline = self.spawned_at + self.plan.startup_timeout
        try:
            line = _read_ready_line(ready_r, self._pidfd, deadline)
        except TimeoutError:
            raise ScorerStartupError(
                f"child not ready within startup_timeout={self.plan.startup_timeout} s",
                self._killed_record(),
            ) from None
        if line is None:
            self.wait_exit(REAP_GRACE_S)
            raise ScorerStartupError("child exited while starting", self.finish())
        try:
            message = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ScorerStartupError(
                f"unreadable readiness line {line[:200]!r}", self._killed_record()
            ) from exc
        if not message.get("ready"):
            self.wait_exit(REAP_GRACE_S)
            code = message.get("exit_code")
            raise ScorerStartupError(
                f"child failed to boot: {message.get('error', '?')}",
                self.finish(),
                boot_code=code if isinstance(code, int) else None,
            )
        message["spawn_to_ready_s"] = time.monotonic() - self.spawned_at
        self.ready_info = message
        return message

    def _killed_record(self) -> ChildRecord:
        self.signal_group(signal.SIGKILL)
        self.wait_exit(REAP_GRACE_S)
        return self.finish()

    # -- stopping ---------------------------------------------------------------------------
    def abort(self) -> None:
        """From another thread, during start(): kill the child so the readiness wait ends at
        once."""
        self._aborted = True  # first: a spawn that has not happened yet sees it
        self.signal_group(signal.SIGKILL)

    def signal_group(self, signum: int) -> None:
        """Signal the child's whole process group (its forkservers and workers too). Only in the
        owning process, and only while the leader's pid is reserved for it (not reaped by us)."""
        if not self.owned or self._pid is None:
            return
        with self._lock:
            if self._reaped:  # its pid may belong to someone else now
                return
            try:
                os.killpg(self._pid, signum)
            except ProcessLookupError:
                pass

    def finish(self) -> ChildRecord:
        """SIGKILL whatever is left of the group, then reap. Bounded; a no-op in a fork."""
        if self._pid is None or not self.owned:
            return self.record()
        self.signal_group(signal.SIGKILL)
        if not self.wait_exit(REAP_GRACE_S):
            log.error(
                "child %s pid %s did not die after SIGKILL; leaving it", self.plan.name, self.pid
            )
            return self.record()
        self._reap()
        return self.record()

    def _reap(self) -> None:
        assert self._pid is not None
        with self._lock:
            if not self._reaped:
                try:
                    os.waitid(os.P_PID, self._pid, os.WEXITED)  # it has exited: returns at once
                except ChildProcessError:
                    pass  # reaped by the kernel meanwhile (SIGCHLD ignored)
                self._reaped = True
            if self._at_exit is not None:
                self._at_exit.detach()  # its pid may be reused now: never killpg it at exit

    def stop(self, graceful_s: float, term_s: float = 2.0) -> ChildRecord:
        """Bounded escalation after a graceful request: wait, SIGTERM the group, wait, finish. With
        no time for SIGTERM (`term_s` 0: an abandoned child), straight to SIGKILL, and nothing to
        warn about."""
        if self._pid is None or not self.owned:
            return self.record()
        if not self.wait_exit(graceful_s) and term_s > 0:
            self.signal_group(signal.SIGTERM)
            if not self.wait_exit(term_s):
                log.warning(
                    "child %s pid %s ignored SIGTERM; sending SIGKILL", self.plan.name, self.pid
                )
        return self.finish()
