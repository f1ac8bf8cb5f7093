"""The grading pool's options, checked once, shared read-only by its parts (`PoolConfig`), and its
defaults.

Why apart: the task manager and the worker manager both read the same bounds (timeouts, overflow,
memory); one frozen record, validated at construction, means neither can see a half-checked value.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

# CPU time: with the forkserver's heap frozen (no 60 ms full collections mid-item), an ordinary item
# takes milliseconds, the slowest of 3,000 about 0.06 s
DEFAULT_SOFT_TIMEOUT_S = 0.1
# held tasks are stopped and cost only memory (each under the cap); a small pool keeps room for a
# few ordinary items that pass the soft deadline beside its pathological ones
MIN_OVERFLOW = 16
WAIT_FACTOR = 4  # a task holding its slot this many soft deadlines moves whatever CPU time it used
DEFAULT_MEMORY_CAP_BYTES = 512 * 2**20  # beyond what a freshly forked worker maps
# the private memory of all held tasks together: one item at its cap, whatever the overflow bound
DEFAULT_MEMORY_BUDGET_BYTES = DEFAULT_MEMORY_CAP_BYTES


@dataclass(frozen=True)
class PoolConfig:
    """A GradingPool's options with defaults applied (see GradingPool.__init__ for their
    meaning)."""

    jobs: int
    timeout_s: float
    grade_fn: str
    preload: tuple[str, ...]
    soft_timeout_s: float
    overflow: int
    memory_cap_bytes: int | None
    warm_replay: int
    memory_budget_bytes: int | None

    @property
    def cpu_limit_s(self) -> float:
        """Each task's CPU-time cap (RLIMIT_CPU): a backstop just past its timeout."""
        return self.timeout_s + 1.0


def build_config(
    jobs: int,
    timeout_s: float,
    grade_fn: str,
    preload: Sequence[str],
    soft_timeout_s: float | None,
    overflow: int | None,
    memory_cap_bytes: int | None,
    warm_replay: int,
    memory_budget_bytes: int | None,
) -> PoolConfig:
    """Check every option (ValueError / TypeError naming it) and apply the defaults."""
    if not _is_int(jobs) or jobs < 1:
        raise ValueError(f"jobs must be an int >= 1, got {jobs!r}")
    _check_timeout(timeout_s)
    soft_timeout_s, overflow = overflow_options(jobs, timeout_s, soft_timeout_s, overflow)
    _check_bytes("memory_cap_bytes", memory_cap_bytes)
    _check_bytes("memory_budget_bytes", memory_budget_bytes)
    _check_grade_fn(grade_fn)
    if isinstance(preload, str) or not all(isinstance(m, str) and m for m in preload):
        raise TypeError(f"preload must be a sequence of module names, got {preload!r}")
    if not _is_int(warm_replay) or warm_replay < 0:
        raise ValueError(f"warm_replay must be an int >= 0, got {warm_replay!r}")
    return PoolConfig(
        jobs=jobs,
        timeout_s=float(timeout_s),
        grade_fn=grade_fn,
        preload=tuple(preload),
        soft_timeout_s=soft_timeout_s,
        overflow=overflow,
        memory_cap_bytes=memory_cap_bytes,
        warm_replay=warm_replay,
        memory_budget_bytes=memory_budget_bytes,
    )


def overflow_options(
    jobs: int, timeout_s: float, soft_timeout_s: float | None, overflow: int | None
) -> tuple[float, int]:
    """The soft deadline and overflow bound with their defaults applied; a bad one is refused."""
    if soft_timeout_s is None:
        soft_timeout_s = min(DEFAULT_SOFT_TIMEOUT_S, timeout_s / 2)
    if isinstance(soft_timeout_s, bool) or not isinstance(soft_timeout_s, (int, float)):
        raise TypeError(f"soft_timeout_s must be a number, got {type(soft_timeout_s).__name__}")
    if not 0 < soft_timeout_s < timeout_s:
        raise ValueError(
            f"soft_timeout_s must be > 0 and below timeout_s={timeout_s}, got {soft_timeout_s!r}"
        )
    overflow = max(MIN_OVERFLOW, 4 * jobs) if overflow is None else overflow
    if not _is_int(overflow) or overflow < 0:
        raise ValueError(f"overflow must be an int >= 0, got {overflow!r}")
    return float(soft_timeout_s), overflow


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_timeout(timeout_s: Any) -> None:
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)):
        raise TypeError(f"timeout_s must be a number, got {type(timeout_s).__name__}")
    if not (math.isfinite(timeout_s) and timeout_s > 0):
        raise ValueError(f"timeout_s must be finite and > 0, got {timeout_s!r}")


def _check_bytes(name: str, value: Any) -> None:
    if value is not None and (not _is_int(value) or value < 2**20):
        raise ValueError(f"{name} must be an int >= 1 MiB or None, got {value!r}")


def _check_grade_fn(grade_fn: Any) -> None:
    module_name, sep, attr = grade_fn.partition(":") if isinstance(grade_fn, str) else ("", "", "")
    if not (module_name and sep and attr):
        raise ValueError(f"grade_fn must be 'module:function', got {grade_fn!r}")
