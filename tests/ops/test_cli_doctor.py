"""`managed-scorers doctor RECIPE`: each check on its own line; a failure says why and what to
do."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT

ENV = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}


def doctor(recipe: dict, tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "recipe.json"
    path.write_text(json.dumps({"reward": recipe}))
    return subprocess.run(
        [sys.executable, "-m", "supervisor", "doctor", str(path)],
        env={**ENV, **env},
        capture_output=True,
        text=True,
        timeout=180,
    )


def one_model(**model: object) -> dict:
    return {
        "models": {"m": {"backend": "managed", **model}},
        "reward_functions": {"t": {"model": "m"}},
    }


@pytest.mark.slow
def test_a_healthy_recipe_passes_every_check(tmp_path):
    done = doctor(one_model(scorer="math_verify", env="math"), tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    for line in ("passes preflight", "runs: Python 3.11", "child boots", "one text sample "
        "scores: reward 1.0",
                 "shared-memory data plane: negotiated", "all checks passed"):  # fmt: skip
        assert line in done.stdout, (line, done.stdout)


@pytest.mark.slow
def test_failures_are_named_with_their_fix(tmp_path):
    fixtures = {"env": "image", "extra_import_paths": [str(REPO_ROOT)]}
    cases = [
        (one_model(scorer="math_verify", env="math"),
         {"MANAGED_SCORERS_ENVS": str(tmp_path / "none")},
         "is not built", "fix: fix the recipe or build the env it names"),
        (one_model(scorer="tests.helpers.fixture_scorers:LoadFails", **fixtures), {},
         "child boots: ", "fix: the scorer's load() failed"),
        (one_model(scorer="tests.helpers.fixture_scorers:Raises", **fixtures), {},
         "one text sample scores: ", "fix: see the message"),
    ]  # fmt: skip
    for recipe, env, failed, fix in cases:
        done = doctor(recipe, tmp_path, **env)
        assert done.returncode == 1, done.stdout + done.stderr
        fail_lines = [line for line in done.stdout.splitlines() if line.startswith("FAIL")]
        assert fail_lines and failed in fail_lines[0], (failed, done.stdout)
        assert fix in done.stdout and "some checks failed" in done.stdout, done.stdout


def test_a_remote_recipe_counts_its_terms_and_scores_a_sample(tmp_path, managed, trainer_python):
    server = managed(trainer_python, "tests.helpers.fixture_scorers:Probe")
    model = {
        "backend": "remote",
        "base_url": f"http://127.0.0.1:{server._child.port}",
        "token_env": "PROBE_TOKEN",
    }
    recipe = {"models": {"m": model}, "reward_functions": {"t": {"model": "m"}}}
    done = doctor(recipe, tmp_path, PROBE_TOKEN=server._child.token)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (
        "1 term(s), 0 checked in their envs" in done.stdout
        and "one text sample scores: reward" in done.stdout
    )
