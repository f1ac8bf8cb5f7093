"""`run_sandboxed`: one untrusted program in a fresh sandbox, answered as a `RunResult`."""

from __future__ import annotations

import contextlib
import marshal
import math
import os
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from importlib import resources
from pathlib import PurePosixPath

from scorers.sandbox import command
from scorers.sandbox.cgroup import SandboxCgroup, find
from scorers.sandbox.exchange import (
    KILL_GRACE_S,
    STOP_GRACE_S,
    Exchange,
    close_lifeline,
    kill_group,
)
from scorers.sandbox.locate import interpreter
from scorers.sandbox.outcome import classify
from scorers.sandbox.results import Limits, RunResult, SandboxStuck
from scorers.sandbox.slots import host_uid

LAUNCHER = resources.files("scorers.sandbox").joinpath("launcher.py").read_text()
NO_FILES: Mapping[str, bytes] = {}
DEFAULT_LIMITS = Limits()
# the sandbox's first process joins its cgroup, then becomes bwrap: every process is born inside
JOIN_CGROUP = ["/bin/sh", "-c", 'echo $$ > "$0" && exec "$@"']


def _checked_name(name: str) -> str:
    path = PurePosixPath(name)
    if path.is_absolute() or ".." in path.parts or not path.parts or name.endswith("/"):
        raise ValueError(f"a sandbox file name must be a relative path inside it: {name!r}")
    return str(path)


def _config(argv: Sequence[str], python: str, files: Mapping[str, bytes], limits: Limits) -> bytes:
    cpu = max(1, math.ceil(limits.cpu_s))
    rlimits = {
        "cpu": [cpu, cpu + 1],  # SIGXCPU at cpu_s, SIGKILL a second later
        "as": [limits.memory_bytes] * 2,
        "nproc": [limits.processes] * 2,
        "nofile": [limits.open_files] * 2,
        "fsize": [limits.file_bytes] * 2,
        "core": [0, 0],
    }
    env = dict(command.SANDBOX_ENV, PATH=os.path.dirname(python) + ":/usr/bin:/bin")
    checked = {_checked_name(name): bytes(data) for name, data in files.items()}
    work = {"argv": list(argv), "env": env, "rlimits": rlimits, "memory": limits.memory_bytes}
    return marshal.dumps(work | {"files": checked})


@contextlib.contextmanager
def _pipes() -> Iterator[dict[str, int]]:
    ends: dict[str, int] = {}
    try:
        for name in ("cfg", "life", "status"):
            ends[name + "_r"], ends[name + "_w"] = os.pipe2(os.O_CLOEXEC)
        yield ends
    finally:
        for fd in ends.values():
            with contextlib.suppress(OSError):
                os.close(fd)


def _spawn(argv: list[str], ends: dict[str, int]) -> subprocess.Popen[bytes]:
    inherited = [ends["cfg_r"], ends["life_r"], ends["status_w"]]
    return subprocess.Popen(
        argv,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        pass_fds=inherited,
        env={},
        start_new_session=True,  # the bwraps' own group: killed whole at a deadline
    )


def _command(python: str, ends: dict[str, int], limits: Limits, uid: int | None) -> list[str]:
    found = interpreter(python)
    stages = command.outer(found, uid) if uid is not None else []
    stages += command.inner(found, limits)
    fds = [str(ends[name]) for name in ("cfg_r", "life_r", "status_w")]
    return [*stages, "--", python, "-I", "-S", "-B", "-c", LAUNCHER, *fds]


@contextlib.contextmanager
def _run_as() -> Iterator[int | None]:
    if os.geteuid() != 0:
        yield None
        return
    with host_uid() as uid:
        yield uid


class PreparedSandbox:
    """A sandbox started ahead of its program: bwrap has built it and its launcher waits for the
    work, so `run` costs about the program's own start. It runs one program; `close` (or the
    `with` block's end) kills it if it never ran. Limits are fixed when it is prepared (the
    tmpfs is already sized); the wall deadline counts from `run`. Any thread may run it, even
    after the one that prepared it ended (tested), but prepare it on a thread that outlives the
    run where you can: bwrap dies with the thread that started it (PR_SET_PDEATHSIG), and a root
    scorer's outer bwrap then waits as a zombie until the run reaps it (`WarmSandboxes` does)."""

    def __init__(self, python: str, limits: Limits = DEFAULT_LIMITS) -> None:
        self.python, self.limits = python, limits
        self._used = False
        self._stack = contextlib.ExitStack()
        self.cgroup: SandboxCgroup | None = None
        try:
            self._ends = self._stack.enter_context(_pipes())
            uid = self._stack.enter_context(_run_as())
            argv = _command(python, self._ends, limits, uid)
            place, _ = find()
            if place is not None:
                self.cgroup = SandboxCgroup(place, limits.memory_bytes)
                argv = [*JOIN_CGROUP, self.cgroup.procs, *argv]
            self._process = _spawn(argv, self._ends)
        except BaseException:
            if self.cgroup is not None:
                self.cgroup.remove()
            self._stack.close()
            raise
        for name in ("cfg_r", "life_r", "status_w"):
            os.close(self._ends.pop(name))

    @property
    def alive(self) -> bool:
        """False once its bwrap has exited (killed, or it failed to build the sandbox)."""
        return self._process.poll() is None

    def run(
        self,
        argv: Sequence[str],
        *,
        stdin: bytes = b"",
        files: Mapping[str, bytes] = NO_FILES,
        limits: Limits | None = None,
    ) -> RunResult:
        """Run `argv` (argv[0] an absolute path inside the sandbox, e.g. `python` itself) with
        `files` in its working dir and `stdin` on its stdin. `limits` replaces the prepared ones
        for this run but for `tmpfs_bytes`, which the sandbox already has."""
        limits = self.limits if limits is None else limits
        if limits.tmpfs_bytes != self.limits.tmpfs_bytes:
            raise ValueError(
                f"a sandbox prepared with tmpfs_bytes={self.limits.tmpfs_bytes} cannot run with "
                f"tmpfs_bytes={limits.tmpfs_bytes}"
            )
        if self._used:
            raise RuntimeError("a prepared sandbox runs one program: prepare another")
        self._used = True
        config = _config(argv, self.python, files, limits)
        started = time.monotonic()
        try:
            if self.cgroup is not None:
                self.cgroup.limit(limits.memory_bytes)
            watch = None if self.cgroup is None else self.cgroup.oom_killed
            exchange = Exchange(self._process, self._ends, limits, started, watch)
            exchange.run(config, stdin)
            oom = watch is not None and watch()
            peak = 0 if self.cgroup is None else self.cgroup.peak_bytes()
        finally:
            self.close()
        return classify(exchange, limits, time.monotonic() - started, oom, peak)

    def close(self) -> None:
        """Stop the sandbox if it is still up (in order, then SIGKILL past STOP_GRACE_S), then free
        its pipes and its host uid. SandboxStuck if its bwrap outlives SIGKILL by the grace."""
        try:
            if self._process.poll() is None:
                close_lifeline(self._ends)  # in order first: pid 1, the kernel, then the bwraps
                try:
                    self._process.wait(timeout=STOP_GRACE_S)
                except subprocess.TimeoutExpired:
                    kill_group(self._process)
                try:
                    self._process.wait(timeout=KILL_GRACE_S)
                except subprocess.TimeoutExpired as error:
                    raise SandboxStuck(
                        f"a prepared sandbox's bwrap (pid {self._process.pid}) outlived SIGKILL "
                        f"by {KILL_GRACE_S:.0f} s"
                    ) from error
        finally:
            for stream in (self._process.stdin, self._process.stdout, self._process.stderr):
                if stream is not None:
                    with contextlib.suppress(BrokenPipeError):
                        stream.close()
            self._stack.close()
            if self.cgroup is not None and self._process.poll() is not None:
                self.cgroup.remove()

    def __enter__(self) -> PreparedSandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def prepare(python: str, limits: Limits = DEFAULT_LIMITS) -> PreparedSandbox:
    """Start a sandbox for `python` now, to run one program in it later (a warm pool's item)."""
    return PreparedSandbox(python, limits)


def run_sandboxed(
    argv: Sequence[str],
    *,
    python: str,
    stdin: bytes = b"",
    files: Mapping[str, bytes] = NO_FILES,
    limits: Limits = DEFAULT_LIMITS,
) -> RunResult:
    """Run `argv` (argv[0] an absolute path inside the sandbox, e.g. `python` itself) in a fresh
    sandbox with `files` in its working dir, `stdin` on its stdin, within `limits`."""
    with prepare(python, limits) as sandbox:
        return sandbox.run(argv, stdin=stdin, files=files)
