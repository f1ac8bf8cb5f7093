"""A real GRPO run: TRL's GRPOTrainer (envs/trl) trains 3 steps on a tiny random model, rewarded by
math_verify in its managed child (envs/math). Every reward TRL logs must equal an independent grade
of the text that was scored, made with math_verify called directly in the math env."""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from tests.conftest import REPO_ROOT, env_python
from tests.helpers.math_env import independent_grades, math_env_processes_since


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_grpo_rewards_equal_an_independent_grade_and_no_scorer_survives(mode, tmp_path):
    report_path = tmp_path / "report.json"
    command = [
        str(env_python("trl")),
        str(REPO_ROOT / "examples" / "trl_grpo.py"),
        "--math-python",
        str(env_python("math")),
        "--steps",
        "3",
        "--force-golds",
        "--report",
        str(report_path),
    ] + (["--async"] if mode == "async" else [])
    start = time.time() - 1.0
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-4000:]
    report = json.loads(report_path.read_text())
    assert report["mode"] == mode and report["name"] == "math_verify"

    calls = report["scored"]
    # one generation batch per step
    assert len(calls) == 3 and all(len(call["texts"]) == 8 for call in calls)
    grades = [independent_grades(call["texts"], call["golds"]) for call in calls]
    for call, grade in zip(calls, grades, strict=True):
        assert call["rewards"] == grade, call
    every = [g for grade in grades for g in grade]
    # scattered golds make some right; random text the rest
    assert 0.0 in every and 1.0 in every, every
    # a different scatter each step: no reward fits a neighbour
    assert len({tuple(grade) for grade in grades}) == 3

    steps = [entry for entry in report["logged"] if entry["mean"] is not None]
    assert [entry["step"] for entry in steps] == [1, 2, 3]
    for entry, grade in zip(steps, grades, strict=True):
        assert entry["rewards"] == grade  # TRL's per-completion record of the step
        assert entry["mean"] == pytest.approx(sum(grade) / len(grade))  # rewards/math_verify/mean

    assert report["child_pids"]
    assert math_env_processes_since(start) == []
