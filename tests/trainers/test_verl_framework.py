"""verl 0.9.1's own reward code (the published package in envs/trl) scoring through the installed
entry point `pkg://supervisor.adapters.verl`: every reward-loop manager in-process, naive and
remote as Ray actors too, and the legacy managers. The trainer env holds hydra-core's antlr 4.9.3,
which grades `10\\%` wrong in-process: the managed math child (antlr 4.13.2) must grade it 0.1 all
the same."""

from __future__ import annotations

import json
import os
import subprocess
import time

import pytest

from tests.conftest import REPO_ROOT, env_python, wait_until_gone
from tests.helpers.math_env import independent_grades, math_env_processes_since

ROWS = [
    ["so \\boxed{10\\%}", "0.1"],
    ["\\boxed{3}", "4"],
    ["the answer is $\\frac{1}{2}$", "0.5"],
    ["\\boxed{7}", "7"],
]
REWARD_LOOP = ["naive", "dapo", "gdpo", "rate_limited", "remote"]


@pytest.mark.slow
def test_every_verl_reward_manager_scores_through_the_installed_entry_point(tmp_path):
    recipe = tmp_path / "reward.yaml"
    models = {
        "math": {
            "backend": "managed",
            "scorer": "math_verify",
            "env": "math",
            "params": {"jobs": 2},
        }
    }
    recipe.write_text(
        json.dumps(
            {"reward": {"models": models, "reward_functions": {"correct": {"model": "math"}}}}
        )
    )
    start = time.time()
    # for the example file, loaded by path
    env = {**os.environ, "MATH_PYTHON": str(env_python("math"))}
    done = subprocess.run(
        [str(env_python("trl")), str(REPO_ROOT / "tests" / "helpers" / "verl_reward_loop.py")]
        + [str(recipe), str(tmp_path), json.dumps(ROWS)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    report = json.loads(done.stdout.splitlines()[-1])
    assert report.pop("decoded") == [text for text, _ in ROWS]  # verl decodes what was written
    expected = independent_grades([text for text, _ in ROWS], [gold for _, gold in ROWS])
    assert expected == [1.0, 0.0, 1.0, 1.0]
    ran = {key.split("/")[0] + "/" + key.split("/")[1] for key in report}
    assert ran == {f"in_process/{m}" for m in REWARD_LOOP} | {"ray/naive", "ray/remote"} | {
        "legacy/naive",
        "legacy/batch",
        "legacy/prime",  # reads float(result[0]): the score, not a silent 0.0
    }
    for key, result in report.items():
        assert result["rewards"] == expected, key
        if key.startswith(("in_process/", "ray/")) and "example_file" not in key:
            # the terms reach verl's reward_extra_info
            assert result["keys"] == ["correct", "score"], key
    # the batch was chunked over 2 actors
    assert len(set(report["ray/naive/compute_score"]["workers"])) == 2
    # no child outlived its worker
    assert wait_until_gone(math_env_processes_since(start), 15) == []
