"""Typed per-test outcomes and the reward they make. Stdlib only.

Each test of a completion ends in one `Outcome`: passed, failed (ran, wrong answer or a failed
assert), timeout, memory, crash (an exception, an exit, a signal, a missing or forged report),
sandbox_error (the sandbox failed: nothing is known of the code). The reward is the fraction of
tests passed, or 1.0 only if all passed ("all"); a sandbox_error makes no reward at all
(`SandboxFailed`), never a 0. Every test's outcome stays in the verdicts, so a timeout is never a
silent 0 in the diagnostics.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Literal, NamedTuple

RewardPolicy = Literal["fraction", "all"]
POLICIES: tuple[RewardPolicy, ...] = ("fraction", "all")


class Outcome(StrEnum):
    PASSED = "passed"
    FAILED = "failed"
    TIMEOUT = "timeout"
    MEMORY = "memory"
    CRASH = "crash"
    SANDBOX_ERROR = "sandbox_error"


@dataclass(frozen=True)
class TestVerdict:
    """One test's outcome; `detail` says why (the exception, the exit, the deadline)."""

    index: int
    outcome: Outcome
    detail: str = ""
    wall_s: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "outcome": self.outcome.value,
            "detail": self.detail,
            "wall_s": self.wall_s,
        }


class GradeResult(NamedTuple):
    """What `grade` answers: the reward and every test's verdict, in the plan's order."""

    reward: float
    verdicts: tuple[TestVerdict, ...]


class SandboxFailed(RuntimeError):
    """The sandbox failed on a run: no reward can be given for this completion (the scorer
    reports an item failure). `verdicts` holds what was learnt, sandbox_error where nothing
    was."""

    def __init__(self, message: str, verdicts: Sequence[TestVerdict]) -> None:
        super().__init__(message)
        self.verdicts = tuple(verdicts)


def reward_of(verdicts: Sequence[TestVerdict], policy: RewardPolicy = "fraction") -> float:
    """The fraction of tests passed ("fraction"), or 1.0 if all passed else 0.0 ("all")."""
    if policy not in POLICIES:
        raise ValueError(f"reward policy {policy!r} is not one of {POLICIES}")
    if not verdicts:
        raise ValueError("no verdict: a plan with no test has no reward")
    broken = [v for v in verdicts if v.outcome is Outcome.SANDBOX_ERROR]
    if broken:
        first = broken[0]
        raise SandboxFailed(
            f"the sandbox failed on {len(broken)} of {len(verdicts)} tests "
            f"(test {first.index}: {first.detail})",
            verdicts,
        )
    passed = sum(v.outcome is Outcome.PASSED for v in verdicts)
    if policy == "all":
        return 1.0 if passed == len(verdicts) else 0.0
    return passed / len(verdicts)


def outcome_counts(verdicts: Sequence[TestVerdict]) -> dict[str, int]:
    """`tests_<outcome>` -> how many tests ended so, every outcome named (diagnostics counts)."""
    counts = {f"tests_{o.value}": 0 for o in Outcome}
    for verdict in verdicts:
        counts[f"tests_{verdict.outcome.value}"] += 1
    return counts
