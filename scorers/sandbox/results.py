"""What one sandboxed run is given (`Limits`) and what it answers (`RunResult`)."""

from __future__ import annotations

from dataclasses import dataclass

STATUSES = ("exited", "timeout", "memory", "signalled", "output_limit", "sandbox_error")


class SandboxUnavailable(RuntimeError):
    """This machine cannot sandbox code (no bwrap in the env, no user namespaces, ...): the message
    names what is missing. Raised at boot by `probe`, never answered by running code unsandboxed."""


class SandboxStuck(RuntimeError):
    """A sandbox's bwrap outlived its SIGKILL by the grace (a process stuck in the kernel): the
    message names its pid and why it was killed."""


@dataclass(frozen=True)
class Limits:
    """Bounds of one run. `cpu_s`, `memory_bytes` (address space), `open_files` and `file_bytes`
    are rlimits of each process; `processes` counts the sandbox's processes (its own user
    namespace); the launcher also kills the whole sandbox when the resident memory of all its
    processes together passes `memory_bytes`. `output_bytes` caps stdout and stderr each."""

    wall_s: float = 10.0
    cpu_s: float = 10.0
    memory_bytes: int = 1 << 30
    processes: int = 64
    open_files: int = 256
    file_bytes: int = 16 << 20
    tmpfs_bytes: int = 64 << 20
    output_bytes: int = 8 << 20

    def __post_init__(self) -> None:
        bad = [f"{name}={value!r}" for name, value in vars(self).items() if not value > 0]
        if bad:
            raise ValueError(f"sandbox limits must be positive: {', '.join(bad)}")


@dataclass(frozen=True)
class RunResult:
    """The outcome of one run.

    status: "exited" (returncode set), "timeout" (the wall deadline, or the CPU rlimit: signal
    SIGXCPU/SIGKILL), "memory" (the sandbox's resident total passed the cap, its cgroup's limit
    made the kernel kill one of its processes, or the program died of MemoryError / ENOMEM under
    its address-space rlimit), "signalled" (another signal),
    "output_limit" (stdout or stderr passed `Limits.output_bytes`: the sandbox was killed),
    "sandbox_error" (the sandbox could not start the program: `detail` says why).
    stdout and stderr hold at most `Limits.output_bytes` each (`*_truncated` when cut).
    peak_rss_bytes: the largest of the launcher's peak sum of anonymous resident memory, the
    largest single process's peak RSS and, with a cgroup, the most the cgroup held (its tmpfs files
    and the page cache it touched included): what a pool's memory budget should count.
    """

    status: str
    returncode: int | None
    signal: int | None
    stdout: bytes
    stderr: bytes
    wall_s: float
    cpu_s: float
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    peak_rss_bytes: int = 0
    detail: str = ""
