"""What one sandboxed run takes and gives back: the contract between the code_exec grader and
whatever runs the program (the sandbox, or the bare runner of the tests and the bench).

`Limits` and `RunResult` mirror the sandbox's own (issue 42, `scorers.sandbox`) field for field; the
lead unifies the two at merge. Stdlib only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

RunStatus = Literal["exited", "timeout", "memory", "signalled", "output_limit", "sandbox_error"]
RUN_STATUSES: tuple[RunStatus, ...] = (
    "exited",
    "timeout",
    "memory",
    "signalled",
    "output_limit",
    "sandbox_error",
)


@dataclass(frozen=True)
class Limits:
    """The bounds of one run: wall and CPU seconds, address space, processes, open files, the
    size of a file it writes, and the size of its private writable tmpfs."""

    wall_s: float = 10.0
    cpu_s: float = 10.0
    memory_bytes: int = 1 << 30
    processes: int = 64
    open_files: int = 256
    file_bytes: int = 16 << 20
    tmpfs_bytes: int = 64 << 20


@dataclass(frozen=True)
class RunResult:
    """How one run ended. `status`: "exited" (by itself: `returncode`), "timeout" (past its wall
    or CPU bound), "memory" (past its memory bound), "signalled" (killed by `signal`),
    "output_limit" (wrote more than the runner keeps), "sandbox_error" (the sandbox itself failed:
    the program's fate is unknown, never a verdict on it)."""

    status: RunStatus
    returncode: int | None
    signal: int | None
    stdout: bytes
    stderr: bytes
    wall_s: float
    cpu_s: float


class Runner(Protocol):
    """Runs one program. `argv` is the whole command line (argv[0] the interpreter, `python`);
    `python` is the interpreter the runner must make available; `files` are written (name ->
    content) into the run's private working directory before it starts, and `stdin` is fed to
    it. A module with a `run_sandboxed` function of this signature is a Runner too."""

    def run_sandboxed(
        self,
        argv: Sequence[str],
        *,
        python: str,
        stdin: bytes = b"",
        files: Mapping[str, bytes] = ...,
        limits: Limits = ...,
    ) -> RunResult: ...
