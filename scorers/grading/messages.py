"""Every message sent on the grading pool's pipes (pool <-> worker, pool <-> template), one frozen
class each.

Why classes and not tuples: a reader of either end sees one name per kind and its fields by name,
and a field added on one side is a type error on the other, not a silent shift of `message[3]`. They
stay small (a few fields, slots): one is pickled per task.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# -- pool -> worker ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Task:
    """Grade `args` (grade_fn's positional arguments)."""

    args: tuple


# -- worker or template -> pool ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Ready:
    """The grader is loaded; the sender serves requests from now on."""

    pid: int


@dataclass(frozen=True, slots=True)
class Fatal:
    """The grader could not be loaded (the formatted exception); the sender exits."""

    text: str


# -- worker -> pool ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Graded:
    """grade_fn returned `value`."""

    value: Any


@dataclass(frozen=True, slots=True)
class OverMemory:
    """The task passed the memory cap (the MemoryError's text); the worker exits."""

    text: str


@dataclass(frozen=True, slots=True)
class Raised:
    """grade_fn raised (or its result would not pickle); the worker stays usable."""

    remote_type: str
    remote_text: str


WorkerReply = Graded | OverMemory | Raised

# -- pool -> template ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Fork:
    """Fork a worker; the new worker's end of its pipe follows (SCM_RIGHTS)."""


@dataclass(frozen=True, slots=True)
class Warm:
    """Replay these tasks while idle; answered by exactly one `Warmed` carrying `number`."""

    number: int
    tasks: list[tuple]


@dataclass(frozen=True, slots=True)
class Halt:
    """Stop replaying after the task in hand (the warm request in hand is answered then)."""


# -- template -> pool ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Forked:
    """The worker asked for has this pid; its pidfd follows (SCM_RIGHTS)."""

    pid: int


@dataclass(frozen=True, slots=True)
class Warmed:
    """The answer to warm request `number`: what the template's replays did so far."""

    number: int
    replayed: int
    failed: int
    rss: int
    can_warm: bool
    tainted: bool


@dataclass(frozen=True, slots=True)
class CloneExited:
    """A worker the template forked exited, with this exit code (negative: killed by that
    signal)."""

    pid: int
    exitcode: int
