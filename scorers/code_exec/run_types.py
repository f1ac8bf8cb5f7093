"""What one sandboxed run takes and gives back: the contract between the code_exec grader and
whatever runs the program (the sandbox, or the bare runner of the tests and the bench).

`Limits` and `RunResult` are the sandbox's own (`scorers.sandbox.results`): one pair for every
runner. Stdlib only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal, Protocol

from scorers.sandbox.results import Limits, RunResult

RunStatus = Literal["exited", "timeout", "memory", "signalled", "output_limit", "sandbox_error"]
RUN_STATUSES: tuple[RunStatus, ...] = (
    "exited",
    "timeout",
    "memory",
    "signalled",
    "output_limit",
    "sandbox_error",
)


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
