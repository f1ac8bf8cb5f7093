"""UniRL 0.2.0's own local scorers in a managed child:
`supervisor.adapters.unirl.ManagedLocalScorer`.

UniRL's own code drives it in envs/trl (tests/helpers/unirl_local.py, one trainer process): Hydra
builds each recipe with only the top `_target_` changed, UniRL's RewardService scores real Samples,
and UniRL's own class, built as UniRL builds it and called in-process on the same Samples, gives the
expected rewards: its rule-based `mc_exact_match`, and a user's model-backed subclass of its
`LocalRewardBackend` (a tiny seeded checkpoint). The child's python is envs/trl's (UniRL and the
child runtime).
"""

from __future__ import annotations

import json
import subprocess

import pytest

from supervisor.adapters.unirl_local import local_spec, spec_fields
from supervisor.errors import ConfigError
from tests.conftest import REPO_ROOT, env_python, launcher_free_env, wait_until_gone

CHECKS = [
    "mc is a UniRL RewardBackend",
    "mc name and kind",
    "mc rewards equal UniRL's in-process",
    "mc rewards graded",
    "mc components",
    "torchvision never imported",
    "model name",
    "model rewards equal UniRL's in-process",
    "model rewards vary",
    "offload and onload reach UniRL's",
    "after offload and onload",
    "nan is an item failure",
    "the failure says why",
    "refused before a child",
    "refused at boot",
]


@pytest.mark.slow
def test_unirls_own_local_scorers_run_managed_and_score_as_unirls_own_class_in_process(tmp_path):
    args = {"child_python": str(env_python("trl")), "workdir": str(tmp_path)}
    done = subprocess.run(
        [str(env_python("trl")), "-m", "tests.helpers.unirl_local", json.dumps(args)],
        cwd=REPO_ROOT,  # this checkout's packages, whatever the env has installed
        env=launcher_free_env(),
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    report = json.loads(done.stdout.splitlines()[-1])
    assert report["passed"] == CHECKS
    assert report["boot_error"] == "ScorerStartupError"
    assert report["children_left"] == [] and len(report["pids"]) == 2
    assert wait_until_gone(report["pids"], 10) == []


def test_a_local_scorer_config_is_read_from_a_spec_or_its_fields_and_a_nameless_one_is_refused():
    assert spec_fields({"_target_": "pkg.mod.Spec", "k": (1, 2)}) == ({"k": [1, 2]}, "pkg.mod.Spec")
    assert spec_fields(None) == ({}, None)
    with pytest.raises(ConfigError, match="Spec"):
        spec_fields("graded_format_reward=true")
    with pytest.raises(ConfigError, match="name the UniRL scorer"):
        local_spec({"graded_format_reward": True}, "cpu", None, {"python_executable": "x"}, None)
