"""UniRL 0.2.0's own local scorers in a managed child:
`supervisor.adapters.unirl.ManagedLocalScorer`.

UniRL's own code drives it in envs/trl (tests/helpers/unirl_local.py, one trainer process): Hydra
builds each recipe with only the top `_target_` changed, UniRL's RewardService scores real Samples,
and UniRL's own class, built as UniRL builds it and called in-process on the same Samples, gives the
expected rewards: its rule-based `mc_exact_match`, its model-backed `LLMJudgeRewardScorer` (its
judge a tiny random model built offline, served by a real engine, `transformers serve` from env
engine), and a user's model-backed subclass of its `LocalRewardBackend` (a tiny seeded
checkpoint). The child's python is envs/trl's (UniRL and the
child runtime).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
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
    "judge name and kind",
    "judge rewards equal UniRL's in-process",
    "judge verdicts vary",
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
    with judge_engine(tmp_path) as (url, model):
        report = _drive(tmp_path, url, model)
    assert report["passed"] == CHECKS
    assert report["boot_error"] == "ScorerStartupError"
    assert report["children_left"] == [] and len(report["pids"]) == 3
    assert wait_until_gone(report["pids"], 10) == []


@contextlib.contextmanager
def judge_engine(tmp_path: Path) -> Iterator[tuple[str, str]]:
    """The tiny random model (tests.helpers.engine_models) served by `transformers serve` from env
    engine, its chat URL and model name; stopped, and its process group gone, at the end."""
    model = tmp_path / "judge"
    python = str(env_python("engine"))
    build = f"from tests.helpers.engine_models import build; build({str(model)!r})"
    subprocess.run([python, "-c", build], cwd=REPO_ROOT, check=True, timeout=120)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    serve = [python, "-m", "transformers.cli.transformers", "serve", str(model), "--device"]
    with (tmp_path / "engine.log").open("w") as log:
        engine = subprocess.Popen(
            [*serve, "cpu", "--host", "127.0.0.1", "--port", str(port)],
            env=launcher_free_env(HF_HUB_OFFLINE="1"),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        _until_serving(f"http://127.0.0.1:{port}", str(model), engine)
        yield f"http://127.0.0.1:{port}/v1/chat/completions", str(model)
    finally:
        os.killpg(engine.pid, signal.SIGKILL)
        engine.wait(10)
    assert wait_until_gone([engine.pid], 10) == []


def _until_serving(base: str, model: str, engine: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        assert engine.poll() is None, f"the engine exited {engine.returncode}"
        try:
            if model in httpx.get(f"{base}/v1/models", timeout=5).text:
                return
        except httpx.HTTPError:
            pass  # not listening yet
        time.sleep(0.5)
    raise AssertionError(f"the engine at {base} did not serve {model} within 120 s")


def _drive(tmp_path: Path, url: str, model: str) -> dict[str, Any]:
    args = {
        "child_python": str(env_python("trl")),
        "workdir": str(tmp_path),
        "judge_url": url,
        "judge_model": model,
    }
    done = subprocess.run(
        [str(env_python("trl")), "-m", "tests.helpers.unirl_local", json.dumps(args)],
        cwd=REPO_ROOT,  # this checkout's packages, whatever the env has installed
        env=launcher_free_env(),
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return dict(json.loads(done.stdout.splitlines()[-1]))


def test_a_local_scorer_config_is_read_from_a_spec_or_its_fields_and_a_nameless_one_is_refused():
    assert spec_fields({"_target_": "pkg.mod.Spec", "k": (1, 2)}) == ({"k": [1, 2]}, "pkg.mod.Spec")
    assert spec_fields(None) == ({}, None)
    with pytest.raises(ConfigError, match="Spec"):
        spec_fields("graded_format_reward=true")
    with pytest.raises(ConfigError, match="name the UniRL scorer"):
        local_spec({"graded_format_reward": True}, "cpu", None, {"python_executable": "x"}, None)
