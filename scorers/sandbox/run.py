"""`run_sandboxed`: one untrusted program in a fresh sandbox, answered as a `RunResult`."""

from __future__ import annotations

import contextlib
import marshal
import math
import os
import subprocess
import time
from collections.abc import Iterator, Mapping
from importlib import resources
from pathlib import PurePosixPath

from scorers.sandbox import command
from scorers.sandbox.exchange import Exchange
from scorers.sandbox.locate import interpreter
from scorers.sandbox.outcome import classify
from scorers.sandbox.results import Limits, RunResult
from scorers.sandbox.slots import host_uid

LAUNCHER = resources.files("scorers.sandbox").joinpath("launcher.py").read_text()
NO_FILES: Mapping[str, bytes] = {}
DEFAULT_LIMITS = Limits()


def _checked_name(name: str) -> str:
    path = PurePosixPath(name)
    if path.is_absolute() or ".." in path.parts or not path.parts or name.endswith("/"):
        raise ValueError(f"a sandbox file name must be a relative path inside it: {name!r}")
    return str(path)


def _config(argv: list[str], python: str, files: Mapping[str, bytes], limits: Limits) -> bytes:
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


def run_sandboxed(
    argv: list[str],
    *,
    python: str,
    stdin: bytes = b"",
    files: Mapping[str, bytes] = NO_FILES,
    limits: Limits = DEFAULT_LIMITS,
) -> RunResult:
    """Run `argv` (argv[0] an absolute path inside the sandbox, e.g. `python` itself) in a fresh
    sandbox with `files` in its working dir, `stdin` on its stdin, within `limits`."""
    config = _config(argv, python, files, limits)
    started = time.monotonic()
    with _pipes() as ends, _run_as() as uid:
        process = _spawn(_command(python, ends, limits, uid), ends)
        for name in ("cfg_r", "life_r", "status_w"):
            os.close(ends.pop(name))
        exchange = Exchange(process, ends, limits, started)
        exchange.run(config, stdin)
    return classify(exchange, limits, time.monotonic() - started)
