"""A finished sandbox's facts -> its `RunResult` (the one place a status is decided)."""

from __future__ import annotations

import re
import signal
from typing import Any

from scorers.sandbox.exchange import Exchange
from scorers.sandbox.results import Limits, RunResult

# the program's own last word on stderr when its address-space rlimit refused an allocation
_CGROUP_OOM = (
    "the sandbox's cgroup passed its memory limit ({} bytes, its tmpfs files included): the "
    "kernel killed a process of it, and the sandbox was killed whole"
)
_OUT_OF_MEMORY = re.compile(rb"(^|\n)(MemoryError\b|.*Cannot allocate memory)[^\n]*\n?\Z")


def _report(exchange: Exchange) -> dict | None:
    """The launcher's line (launcher.py): `exec_failed <why>` or `done|memory code cpu peak`."""
    line = bytes(exchange.status).decode(errors="replace").strip()
    kind, _, rest = line.partition(" ")
    if kind == "exec_failed":
        return {"kind": kind, "detail": rest}
    words = rest.split()
    if kind not in ("done", "memory") or len(words) != 3:
        return None
    return {
        "kind": kind,
        "code": int(words[0]),
        "cpu_s": float(words[1]),
        "peak_rss": int(words[2]),
    }


def _program_status(report: dict, stderr: bytes, limits: Limits) -> tuple[str, int | None]:
    """(status, signal) of a program the launcher saw end."""
    if report["kind"] == "memory":
        return "memory", signal.SIGKILL
    code = int(report["code"])
    if code < 0:
        sig = -code
        # the kernel sends SIGXCPU at the soft CPU limit, SIGKILL at the hard one (a second
        # later, where SIGXCPU is caught): rusage samples CPU time coarser than the limit does
        spent = float(report["cpu_s"]) >= limits.cpu_s * 0.5
        if sig == signal.SIGXCPU or (sig == signal.SIGKILL and spent):
            return "timeout", sig
        return "signalled", sig
    if code != 0 and _OUT_OF_MEMORY.search(stderr.rstrip(b"\n")[-4096:] + b"\n"):
        return "memory", None
    return "exited", None


def classify(
    exchange: Exchange,
    limits: Limits,
    wall_s: float,
    oom_killed: bool = False,
    cgroup_peak: int = 0,
) -> RunResult:
    """`oom_killed`: the kernel killed a process of the sandbox's cgroup for its memory limit: a
    "memory" outcome, whatever it cost the launcher's report (never a sandbox_error).
    `cgroup_peak`: the most memory the sandbox's cgroup held (0: no cgroup)."""
    stdout, stderr = bytes(exchange.out["stdout"]), bytes(exchange.out["stderr"])
    report = _report(exchange)
    common: dict[str, Any] = {
        "stdout": stdout,
        "stderr": stderr,
        "wall_s": wall_s,
        "stdout_truncated": exchange.truncated["stdout"],
        "stderr_truncated": exchange.truncated["stderr"],
    }
    if exchange.killed_for is not None or oom_killed:
        why = exchange.killed_for or "memory"
        detail = _CGROUP_OOM.format(limits.memory_bytes) if why == "memory" else ""
        return RunResult(
            why,
            None,
            signal.SIGKILL,
            cpu_s=0.0,
            peak_rss_bytes=cgroup_peak,
            detail=detail,
            **common,
        )
    if report is None or report.get("kind") == "exec_failed":
        why = (report or {}).get("detail") or "no report from the sandbox's launcher"
        detail = f"{why}; bwrap exited {exchange.returncode}; stderr: {stderr[-2000:]!r}"
        return RunResult("sandbox_error", None, None, cpu_s=0.0, detail=detail, **common)
    status, sig = _program_status(report, stderr, limits)
    code = int(report["code"])
    return RunResult(
        status,
        code if code >= 0 else None,
        sig,
        cpu_s=float(report["cpu_s"]),
        peak_rss_bytes=max(int(report["peak_rss"]), cgroup_peak),
        **common,
    )
