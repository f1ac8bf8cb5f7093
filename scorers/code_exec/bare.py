"""The bare runner: a plain subprocess, no sandbox. For the tests of the grader and as the bench's
"no sandbox" baseline only; no scorer uses it by default (the sandbox is the scorer's runner).

The program runs in a fresh temporary directory holding its files, in a session and process group
of its own, with a scrubbed environment and rlimits (CPU, address space, open files, file size).
At its wall deadline, or as soon as it exits, its whole process group is SIGKILLed and reaped.
What it does NOT do (it is not a sandbox): no network, mount, PID or user namespace, so the program
sees the machine, can reach the network, and a descendant that leaves the process group (setsid)
outlives it; RLIMIT_NPROC is not set (it counts every process of the uid, and root ignores it).
"""

from __future__ import annotations

import math
import os
import resource
import selectors
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from scorers.code_exec.run_types import Limits, RunResult, RunStatus

# what the runner keeps of each of stdout and stderr; more on stdout is "output_limit"
DEFAULT_OUTPUT_BYTES = 8 << 20
_READ_CHUNK = 1 << 16


class BareRunnerError(RuntimeError):
    """The bare runner could not start or reap the program (not a verdict on the program)."""


@dataclass
class _Streams:
    stdout: bytearray
    stderr: bytearray
    over_limit: bool = False


def _rlimits(limits: Limits) -> Callable[[], None]:
    cpu = max(1, math.ceil(limits.cpu_s))

    def apply() -> None:  # in the child, between fork and exec: stdlib calls only
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
        resource.setrlimit(resource.RLIMIT_AS, (limits.memory_bytes, limits.memory_bytes))
        resource.setrlimit(resource.RLIMIT_NOFILE, (limits.open_files, limits.open_files))
        resource.setrlimit(resource.RLIMIT_FSIZE, (limits.file_bytes, limits.file_bytes))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

    return apply


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass  # the group is already empty


def _exited(pid: int) -> bool:
    """True once the process has exited; it stays a zombie (reaped by wait4 for its rusage), so
    its pid, and with it the process group id, is not reused meanwhile."""
    return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None


def _pump(proc: subprocess.Popen[bytes], deadline: float, cap: int) -> tuple[_Streams, bool]:
    """Read stdout and stderr until both close or the deadline; (streams, timed out)."""
    streams = _Streams(bytearray(), bytearray())
    sel = selectors.DefaultSelector()
    assert proc.stdout is not None and proc.stderr is not None
    sel.register(proc.stdout, selectors.EVENT_READ, streams.stdout)
    sel.register(proc.stderr, selectors.EVENT_READ, streams.stderr)
    try:
        while sel.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                return streams, True
            for key, _ in sel.select(min(left, 0.5)):
                chunk = os.read(key.fd, _READ_CHUNK)
                if not chunk:
                    sel.unregister(key.fileobj)
                    continue
                buffer: bytearray = key.data
                buffer += chunk[: max(0, cap - len(buffer))]
                if len(buffer) >= cap and key.data is streams.stdout:
                    streams.over_limit = True
                    return streams, False
            if _exited(proc.pid):
                _kill_group(proc.pid)  # what it left behind in its group, so the pipes close
        return streams, False
    finally:
        sel.close()


def _status(
    timed_out: bool, over: bool, returncode: int, cpu_s: float, limits: Limits
) -> RunStatus:
    if timed_out:
        return "timeout"
    if over:
        return "output_limit"
    if returncode == -signal.SIGXCPU or (returncode == -signal.SIGKILL and cpu_s >= limits.cpu_s):
        return "timeout"  # RLIMIT_CPU: SIGXCPU at the soft bound, SIGKILL at the hard one
    if returncode < 0:
        return "signalled"
    return "exited"


class BareRunner:
    """`Runner` over a plain subprocess (see the module docstring for what it does not isolate)."""

    def __init__(self, output_bytes: int = DEFAULT_OUTPUT_BYTES) -> None:
        self.output_bytes = output_bytes

    def run_sandboxed(
        self,
        argv: Sequence[str],
        *,
        python: str,
        stdin: bytes = b"",
        files: Mapping[str, bytes] | None = None,
        limits: Limits | None = None,
    ) -> RunResult:
        limits = limits or Limits()
        if not argv or argv[0] != python:
            raise BareRunnerError(f"argv must start with the interpreter {python!r}: {argv!r}")
        work = tempfile.mkdtemp(prefix="code-exec-")
        try:
            return self._run(list(argv), stdin, dict(files or {}), limits, work)
        finally:
            shutil.rmtree(work, ignore_errors=False)

    def _run(
        self, argv: list[str], stdin: bytes, files: dict[str, bytes], limits: Limits, work: str
    ) -> RunResult:
        home = os.path.join(work, "home")
        os.mkdir(home)
        for name, content in files.items():
            if os.path.basename(name) != name or name in ("", ".", "..", "home", ".stdin"):
                raise BareRunnerError(f"file name {name!r} must be a plain name in the work dir")
            with open(os.path.join(home, name), "wb") as f:
                f.write(content)
        stdin_path = os.path.join(work, ".stdin")
        with open(stdin_path, "wb") as f:
            f.write(stdin)
        env = {"PATH": "/usr/bin:/bin", "HOME": home, "LANG": "C.UTF-8", "TMPDIR": home}
        started = time.monotonic()
        with open(stdin_path, "rb") as stdin_file:
            try:
                proc = subprocess.Popen(
                    argv,
                    cwd=home,
                    env=env,
                    stdin=stdin_file,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    start_new_session=True,
                    preexec_fn=_rlimits(limits),  # rlimits set in the child before exec
                )
            except OSError as exc:
                raise BareRunnerError(f"cannot start {argv[0]}: {exc}") from exc
        return self._finish(proc, started, limits)

    def _finish(self, proc: subprocess.Popen[bytes], started: float, limits: Limits) -> RunResult:
        try:
            streams, timed_out = _pump(proc, started + limits.wall_s, self.output_bytes)
        finally:
            _kill_group(proc.pid)
            _, status, usage = os.wait4(proc.pid, 0)
            proc.returncode = os.waitstatus_to_exitcode(status)
            assert proc.stdout is not None and proc.stderr is not None
            proc.stdout.close()
            proc.stderr.close()
        returncode = proc.returncode
        cpu_s = usage.ru_utime + usage.ru_stime
        state = _status(timed_out, streams.over_limit, returncode, cpu_s, limits)
        return RunResult(
            status=state,
            returncode=returncode if returncode >= 0 else None,
            signal=-returncode if returncode < 0 else None,
            stdout=bytes(streams.stdout),
            stderr=bytes(streams.stderr),
            wall_s=time.monotonic() - started,
            cpu_s=cpu_s,
        )
