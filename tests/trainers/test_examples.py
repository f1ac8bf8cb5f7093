"""The examples run as a user would run them (the TRL one runs in
tests/trainers/test_trl_grpo.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from supervisor import ConfigError, LocalRewardBackend
from supervisor.adapters.ddpo import DDPORewardFn
from tests.conftest import REPO_ROOT, env_python, wait_until_gone

# What verl does with `reward.custom_reward_function.path`: load the file by path, then call its
# function from the reward loop (per-item tasks), the legacy naive manager, or the batch manager.
VERL_DRIVER = """
import asyncio, importlib.util, json, sys

spec = importlib.util.spec_from_file_location("custom_module", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
rows = [
    ("so \\\\boxed{10\\\\%}", "0.1"),
    ("\\\\boxed{3}", "4"),
    ("the answer is $\\\\frac{1}{2}$", "0.5"),
] * 6


async def reward_loop():
    tasks = [
        module.compute_score("math", text, gold, {"index": i})
        for i, (text, gold) in enumerate(rows)
    ]
    return await asyncio.gather(*tasks)


per_item = asyncio.run(reward_loop())
sync = module.compute_score_sync("math", "\\\\boxed{2}", "2", {"index": 0})
batch = module.compute_score_batch(["math"] * 3, [t for t, _ in rows[:3]], [g for _, g in rows[:3]])
scorer = module.scorer()
print(
    json.dumps(
        {
            "per_item": [r["score"] for r in per_item],
            "sync": sync["score"],
            "batch": [r["score"] for r in batch],
            "batches": list(scorer.stream.window_sizes),
            "child": scorer.backend.pid,
        }
    )
)
"""


@pytest.mark.slow
def test_verl_example_scores_per_item_coalesced_sync_and_batch_then_closes_at_exit(tmp_path):
    env = {**os.environ, "MATH_PYTHON": str(env_python("math"))}
    done = subprocess.run(
        [sys.executable, "-c", VERL_DRIVER, str(REPO_ROOT / "examples" / "verl_compute_score.py")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    report = json.loads(done.stdout.splitlines()[-1])
    # 10\\% is 0.1: graded with the child's antlr 4.13.2
    assert report["per_item"] == [1.0, 0.0, 1.0] * 6
    assert report["batches"] == [18]  # the reward loop's 18 tasks went as one request
    assert report["sync"] == 1.0 and report["batch"] == [1.0, 0.0, 1.0]
    assert wait_until_gone([report["child"]], 10) == []  # closed at the worker's exit


# What verl 0.9.1 does with `custom_reward_function: {path: pkg://..., name: ..., reward_kwargs:
# {...}}`: import the module, wrap the function in a partial with the kwargs, pickle it to the
# reward workers (the `remote` manager does), then call it per rollout (async), or sync, or with
# lists.
VERL_PKG_DRIVER = """
import asyncio, functools, importlib, json, pickle, sys

recipe = sys.argv[1]
module = importlib.import_module("supervisor.adapters.verl")


def loaded(name):
    return pickle.loads(pickle.dumps(functools.partial(getattr(module, name), recipe=recipe)))


rows = [
    ("so \\\\boxed{10\\\\%}", "0.1"),
    ("\\\\boxed{3}", "4"),
    ("the answer is $\\\\frac{1}{2}$", "0.5"),
] * 6
compute_score = loaded("compute_score")


async def reward_loop():
    tasks = [compute_score("math", text, gold, {"index": i}) for i, (text, gold) in enumerate(rows)]
    return await asyncio.gather(*tasks)


per_item = asyncio.run(reward_loop())
sync = loaded("compute_score_sync")("math", "\\\\boxed{2}", "2", {"index": 0})
batch = loaded("compute_score_batch")(
    ["math"] * 3, [t for t, _ in rows[:3]], [g for _, g in rows[:3]]
)
scorer = module.scorer_for(recipe)
child = scorer.backend.terms[0].backend.pid
print(
    json.dumps(
        {
            "per_item": [r["score"] for r in per_item],
            "sync": sync["score"],
            "terms": sorted(per_item[0]),
            "batch": [r["score"] for r in batch],
            "batches": list(scorer.stream.window_sizes),
            "child": child,
        }
    )
)
"""


@pytest.mark.slow
def test_verl_installed_entry_point_loads_by_module_pickles_and_scores_every_form(tmp_path):
    """`pkg://supervisor.adapters.verl` with `reward_kwargs: {recipe: ...}`: nothing to copy, a
    partial that pickles (by reference), one panel per process and recipe, rewards as the math child
    grades them."""
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
    done = subprocess.run(
        [sys.executable, "-c", VERL_PKG_DRIVER, str(recipe)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    report = json.loads(done.stdout.splitlines()[-1])
    # 10\\% is 0.1: graded with the child's antlr 4.13.2
    assert report["per_item"] == [1.0, 0.0, 1.0] * 6
    assert report["batches"] == [18] and report["terms"] == ["correct", "score"]
    assert report["sync"] == 1.0 and report["batch"] == [1.0, 0.0, 1.0]
    assert wait_until_gone([report["child"]], 10) == []  # closed at the worker's exit


def test_verl_installed_entry_point_without_a_recipe_says_how_to_give_one(monkeypatch):
    from supervisor.adapters import verl

    monkeypatch.delenv(verl.RECIPE_VARIABLE, raising=False)
    with pytest.raises(ConfigError, match="reward_kwargs: {recipe: /path/reward.yaml}"):
        verl.compute_score_sync("math", "1", "1")


@pytest.mark.slow
def test_ddpo_example_rewards_smooth_over_noisy_as_in_process(tmp_path):
    from examples.ddpo_jpeg import sample

    report_path = tmp_path / "report.json"
    done = subprocess.run(
        [
            sys.executable,
            str(REPO_ROOT / "examples" / "ddpo_jpeg.py"),
            "--image-python",
            str(env_python("image")),
            "--report",
            str(report_path),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    report = json.loads(report_path.read_text())
    assert len(report["rewards"]) == 3
    with LocalRewardBackend("jpeg_compressibility") as local:
        reward_fn = DDPORewardFn(local, output_range="zero_one")
        for seed, rewards in zip(report["seeds"], report["rewards"], strict=True):
            assert np.all(np.diff(rewards) < 0), rewards  # more noise, bigger JPEG, lower reward
            expected, _ = reward_fn(sample(seed, 4), ["p"] * 4, [{}] * 4)
            assert rewards == expected.tolist()


FAILING_BOOT_DRIVER = """
import asyncio, importlib.util, json, sys
spec = importlib.util.spec_from_file_location("custom_module", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)

async def reward_loop():
    tasks = [module.compute_score("math", "1", "1", {"index": i}) for i in range(8)]
    return await asyncio.gather(*tasks, return_exceptions=True)

results = asyncio.run(reward_loop())
print(json.dumps({"errors": sorted({type(r).__name__ for r in results}),
                  "all_failed": all(isinstance(r, Exception) for r in results)}))
"""


@pytest.mark.slow
def test_verl_example_fails_every_task_at_once_when_its_child_cannot_start(tmp_path):
    """A child that cannot boot is one failure for the worker, not one boot attempt per task."""
    broken, boots = tmp_path / "python", tmp_path / "boots"
    broken.write_text(f"#!/bin/sh\necho boot >> {boots}\nsleep 1\nexit 3\n")
    broken.chmod(0o755)
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            FAILING_BOOT_DRIVER,
            str(REPO_ROOT / "examples" / "verl_compute_score.py"),
        ],
        cwd=tmp_path,
        env={**os.environ, "MATH_PYTHON": str(broken)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    report = json.loads(done.stdout.splitlines()[-1])
    assert report["all_failed"] and report["errors"] == ["ScorerStartupError"], report
    assert boots.read_text().splitlines() == ["boot"]  # one boot attempt, not one per task
