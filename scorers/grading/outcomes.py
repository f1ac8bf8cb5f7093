"""What one grade() call is while in flight (`Batch`) and what each of its tasks came to
(`GradeOutcome`).

Why apart: the task manager fills batches and the worker manager's records point at the batch their
task belongs to; both import this, neither imports the other's module for it.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class GradeOutcome:
    """One task's outcome: `value` is grade_fn's result when status is "ok", else None."""

    # "ok" | "timeout" | "memory" (past the memory cap) | "cpu" (past the CPU-time cap) | "budget"
    # (held tasks together past the pool's memory budget)
    status: str
    value: Any
    elapsed_s: float
    # it passed the soft deadline and finished (or not) in an overflow worker
    overflowed: bool = False
    # when the owner recorded it
    finished_at: float = field(default_factory=time.monotonic, compare=False)


@dataclass(eq=False)
class Batch:
    """One grade() call in flight."""

    tasks: list[tuple]
    deadline: float
    label: str
    outcomes: list[GradeOutcome | None]
    pending: deque[int] = field(default_factory=deque)
    done: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None  # why it failed (set before `done`)
    cancelled: bool = False  # its caller gave up (Ctrl-C) while another thread drove the pool
