"""Rewards that run model-written code: test formats (`cases`), the in-sandbox harness
(`harness`), typed verdicts (`verdicts`) and `grade`, the one call a scorer makes.

`grade(completion, parse_cases(reference), runner, python)` -> `GradeResult(reward, verdicts)`.
The runner is the sandbox (`scorers.sandbox`); `bare.BareRunner` is the tests' and the bench's
unsandboxed baseline, never a scorer's default. Stdlib only (`harness.py` runs in the sandbox).
"""

from scorers.code_exec.cases import CaseError, TestPlan, parse_cases
from scorers.code_exec.grade import Deadlines, grade
from scorers.code_exec.run_types import Limits, Runner, RunResult
from scorers.code_exec.verdicts import (
    GradeResult,
    Outcome,
    SandboxFailed,
    TestVerdict,
    outcome_counts,
    reward_of,
)

__all__ = [
    "CaseError",
    "Deadlines",
    "GradeResult",
    "Limits",
    "Outcome",
    "RunResult",
    "Runner",
    "SandboxFailed",
    "TestPlan",
    "TestVerdict",
    "grade",
    "outcome_counts",
    "parse_cases",
    "reward_of",
]
