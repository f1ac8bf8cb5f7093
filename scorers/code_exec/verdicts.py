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


# one letter per outcome, for an item's verdict string (`item_details`)
LETTERS = {
    Outcome.PASSED: "P",
    Outcome.FAILED: "F",
    Outcome.TIMEOUT: "T",
    Outcome.MEMORY: "M",
    Outcome.CRASH: "C",
    Outcome.SANDBOX_ERROR: "S",
}
DETAIL_KEYS = ("verdicts", "passed", "tests", "failures", "wall_s")
_LETTERS_SHOWN = 2048  # a completion's verdict string is cut past this many tests
_FAILURES_SHOWN = 3
_FAILURE_CHARS = 200


def item_details(verdicts: Sequence[TestVerdict]) -> dict[str, Any]:
    """What one completion's tests said, as its per-item details (`scorers.details`): every test's
    outcome as a letter in the tests' order (`LETTERS`: "PPTF" passed two, timed out on the third,
    failed the fourth; cut after 2,048 tests, where `tests` still counts them all), how many passed,
    the first failures with why, and the tests' summed wall time."""
    verdicts = sorted(verdicts, key=lambda v: v.index)  # the reference's order
    failures = [v for v in verdicts if v.outcome is not Outcome.PASSED][:_FAILURES_SHOWN]
    walls = [v.wall_s for v in verdicts if v.wall_s is not None]
    return {
        "verdicts": "".join(LETTERS[v.outcome] for v in verdicts[:_LETTERS_SHOWN]),
        "passed": sum(v.outcome is Outcome.PASSED for v in verdicts),
        "tests": len(verdicts),
        "failures": [
            {"test": v.index, "outcome": v.outcome.value, "detail": _text(v.detail)}
            for v in failures
        ],
        "wall_s": round(sum(walls), 4),
    }


def _text(detail: str) -> str:
    """A failure's why, short and valid UTF-8 (a program's output may hold lone surrogates)."""
    return detail[:_FAILURE_CHARS].encode("utf-8", "replace").decode("utf-8")
