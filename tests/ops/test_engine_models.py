"""verl-omni named engine models (`backend: engine`): a real OpenAI-compatible engine
(`transformers serve`, env engine, a tiny model built offline) owned by a managed child, its reward
functions called through `reward_router_address` and `model_name` as the seed shows, sync and
async, beside a native model in one recipe; offload as stop and restart; the engine's failures
typed with its log; nothing left behind, not even when the child is killed -9."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest

from supervisor import (
    ConfigError,
    RewardItem,
    RewardRequest,
    build_panels,
    load_recipe,
)
from supervisor.errors import ScorerError
from tests.conftest import REPO_ROOT, env_python, launcher_free_env, wait_until_gone
from tests.helpers.native_models import images

HELPER = REPO_ROOT / "tests" / "helpers" / "engine_models.py"
NATIVE = REPO_ROOT / "tests" / "helpers" / "native_models.py"
COUNT = 4
SERVE = "{python} -m transformers.cli.transformers serve {model_path} --device {device}"
SERVE += " --host 127.0.0.1 --port {port}"


def _metadata() -> list[dict[str, Any]]:
    return [{"uid": f"i{i}", "flaky": False, "fail_words": i == 2} for i in range(COUNT)]


def _references() -> list[str]:
    return ["a good cat", "no", "yes bad", "the image is"]


def _run(*args: str, env: str, timeout: float = 180) -> str:
    done = subprocess.run(
        [str(env_python(env)), *args],
        env=launcher_free_env(HF_HUB_OFFLINE="1"),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.splitlines()[-1]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The tiny model, each item's reply from it called directly, and the native model's weights
    with its in-process values (env embed)."""
    out = tmp_path_factory.mktemp("engine")
    cases = [
        {"brightness": float(image.astype(np.float32).mean()), "prompt": prompt}
        for image, prompt in zip(images(COUNT), _references(), strict=True)
    ]
    (out / "cases.json").write_text(json.dumps(cases))
    model = str(out / "model")
    arrays = {f"image{i}": image for i, image in enumerate(images(COUNT))}
    spec = json.dumps({"metadata": _metadata(), "references": _references()})
    np.savez(out / "inputs.npz", spec=np.array(spec), **arrays)
    # two envs, nothing shared: side by side (each is mostly one core's imports)
    with ThreadPoolExecutor(2) as pool:
        engine = pool.submit(_run, str(HELPER), model, str(out / "cases.json"), env="engine")
        embed = pool.submit(_run, str(NATIVE), str(out), str(out / "inputs.npz"), env="embed")
        replies, native = json.loads(engine.result()), json.loads(embed.result())
    return {"dir": out, "replies": replies, "aesthetic": native["aesthetic"]}


def _engine(model_path: Path, **changes: Any) -> dict[str, Any]:
    model = {"backend": "engine", "device": "cpu", "model_path": str(model_path)}
    model.update(command=SERVE, ready_timeout_s=120, **changes)
    return model


def _recipe(served: dict[str, Any], **changes: Any) -> dict[str, Any]:
    out = served["dir"]
    return {
        "reward": {
            "reward_manager": {"name": "MultiVisualRewardManager"},
            "reward_model": {"enable": False, "model_path": str(out / "model")},
            "models": {
                "ocr": {**_engine(out / "model"), **changes},
                "aesthetic": {
                    "backend": "native",
                    "env": "embed",
                    "model_path": str(out / "aesthetic.pt"),
                    "placement": {"devices": ["cpu"]},
                    "executor": {"model": f"{NATIVE}:AestheticModel"},
                },
            },
            "reward_functions": {
                "ocr": {"path": str(HELPER), "name": "compute_score", "required": True},
                "words": {"model": "ocr", "path": str(HELPER), "name": "length_score"},
                "aesthetic": {
                    "path": str(NATIVE),
                    "name": "aesthetic_score",
                    "trace_dir": str(out),
                    "weight": 0.5,
                },
            },
        }
    }


def _items() -> list[RewardItem]:
    return [
        RewardItem(id=meta["uid"], image=image, reference=gt, metadata=meta, data_source="d")
        for image, meta, gt in zip(images(COUNT), _metadata(), _references(), strict=True)
    ]


def _engines(model_dir: Path) -> list[psutil.Process]:
    """Live engine processes serving this model (by their command line)."""
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        cmdline = proc.info["cmdline"] or []
        if str(model_dir) in cmdline and "keeper.py" not in " ".join(cmdline):
            if proc.info["status"] != psutil.STATUS_ZOMBIE:
                found.append(proc)
    return found


@pytest.mark.slow
def test_engine_and_native_models_score_in_one_recipe_as_called_directly(served):
    """Offload: the engine is stopped after each call (restart mode: transformers serve has no
    sleep endpoints) and started again by the next; values equal the model called directly."""
    from tests.helpers.engine_models import parse_score

    model_dir = served["dir"] / "model"
    train, _ = build_panels(load_recipe(_recipe(served)))
    try:
        assert _engines(model_dir) == []  # slept at once after its start-up check
        request = RewardRequest(items=_items())
        first = train.compute_rewards(request)
        ocr = [parse_score(reply) for reply in served["replies"]]
        words = [float(len(reply.split())) for reply in served["replies"]]
        assert first.component_rewards["ocr"] == ocr
        assert first.component_rewards["words"][:2] == words[:2]
        assert first.component_rewards["words"][2] is None  # the optional sync term's failure
        assert first.component_rewards["aesthetic"] == served["aesthetic"]
        expected = [
            o + w + 0.5 * a for o, w, a in zip(ocr, words, served["aesthetic"], strict=True)
        ]
        expected[2] -= words[2]
        assert first.rewards == pytest.approx(expected, rel=1e-12)
        values = first.diagnostics["ocr"]["values"]
        # the engine's tree (keeper, server) as it served: a Python with torch, well over 100 MB
        assert values["engine_start_s"]["sum"] > 0 and values["engine_rss_bytes"]["sum"] > 1e8
        assert _engines(model_dir) == []  # slept (stopped) after the call, woken for it
    finally:
        train.close()
    assert _engines(model_dir) == []


@pytest.mark.slow
def test_a_dead_engine_fails_the_call_with_its_log_and_a_killed_child_takes_it_along(served):
    model_dir = served["dir"] / "model"
    recipe = _recipe(served, offload=False)
    del recipe["reward"]["models"]["aesthetic"], recipe["reward"]["reward_functions"]["aesthetic"]
    train, _ = build_panels(load_recipe(recipe))
    try:
        request = RewardRequest(items=_items()[:2])
        first = train.compute_rewards(request)
        assert first.successes == [True, True]
        # resident: its engine started once at boot, never stopped and started again
        assert "engine_sleep_s" not in first.diagnostics["ocr"]["values"]
        (engine,) = _engines(model_dir)  # resident: served between calls
        keeper = engine.parent()
        engine.kill()
        with pytest.raises(ScorerError, match=r"engine for model .* (exited|not answering)") as e:
            train.compute_rewards(request)
        assert "signal SIGKILL" in str(e.value)  # the status the keeper saw
        assert wait_until_gone([keeper.pid], 5) == []
        # the next call starts the engine anew: the same rewards
        assert train.compute_rewards(request).rewards == first.rewards
        # the child killed -9 with its engine up: the keeper sees the pipe close, ends the engine
        (engine,) = _engines(model_dir)
        keeper = engine.parent()
        os.kill(train.terms[0].backend.pid, signal.SIGKILL)
        assert wait_until_gone([engine.pid, keeper.pid], 15) == []
    finally:
        train.close()


@pytest.mark.slow
def test_a_trainer_killed_9_takes_its_engine_along(served):
    """The trainer dies; its child's lifeline kills the child's group; the keeper, in a session of
    its own, sees the child's pipe close and ends the engine."""
    model_dir = served["dir"] / "model"
    params = {
        "model_name": str(model_dir),
        "command": [part.replace("{model_path}", str(model_dir)) for part in SERVE.split()],
        "functions": [{"term": "ocr", "path": str(HELPER), "name": "compute_score"}],
        "ready_timeout_s": 120,
    }
    scorer = "scorers.engine.scorer:EngineModelScorer"
    trainer = subprocess.Popen(
        [sys.executable, "-m", "tests.helpers.orphan_parent", str(env_python("engine")), scorer,
         json.dumps(params), "idle", "1", "image"],
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO_ROOT,
        env=launcher_free_env(),
    )  # fmt: skip
    try:
        reported = json.loads(trainer.stdout.readline())  # the child is up, its engine awake
        (engine,) = _engines(model_dir)
        keeper = engine.parent()
        trainer.kill()
        trainer.wait(10)
        assert wait_until_gone([reported["child"], keeper.pid, engine.pid], 20) == []
    finally:
        trainer.kill()
        trainer.wait(10)


def test_a_function_that_cannot_take_the_engines_arguments_is_refused_at_boot():
    from scorers.native.calls import bind
    from scorers.native.loading import NativeSetupError

    def old(data_source, solution_image, ground_truth, extra_info, reward_router_address):
        return 0.0

    def tokenized(data_source, solution_image, ground_truth, extra_info, **kwargs):
        return 0.0

    def needs(data_source, solution_image, ground_truth, extra_info, tokenizer, **kwargs):
        return 0.0

    handles = ("reward_router_address", "model_name")
    with pytest.raises(NativeSetupError, match=r"does not take \['model_name'\]"):
        bind("ocr", old, {}, (), handles)
    assert bind("ocr", tokenized, {"scale": 2}, (), handles).extra == {"scale": 2}
    with pytest.raises(NativeSetupError, match=r"needs \['tokenizer'\], which no call passes"):
        bind("ocr", needs, {}, (), handles)
    assert bind("ocr", needs, {"tokenizer": "t"}, (), handles).extra == {"tokenizer": "t"}


def test_an_engine_that_cannot_start_is_a_boot_failure_naming_its_log(served, tmp_path):
    recipe = _recipe(served, model_path=str(tmp_path / "missing"))
    del recipe["reward"]["models"]["aesthetic"], recipe["reward"]["reward_functions"]["aesthetic"]
    with pytest.raises(ScorerError, match=r"engine for model .*missing.* exited while starting"):
        build_panels(load_recipe(recipe))
    assert _engines(tmp_path / "missing") == []


SEED_MIGRATED = """
reward:
  reward_model:
    enable: false
    enable_resource_pool: true
    n_gpus_per_node: 2
    nnodes: 1
  models:
    ocr:
      backend: engine
      model_path: /models/ocr
      n_gpus_per_node: 2
      nnodes: 1
      rollout:
        name: vllm
        tensor_model_parallel_size: 2
  reward_functions:
    ocr:
      path: pkg://my_package.ocr_reward
      name: compute_score
      weight: 1.0
      required: true
"""
SEED_MIXED = """
reward:
  reward_model:
    enable: false
    enable_resource_pool: true
    n_gpus_per_node: 4
    nnodes: 1
  models:
    ocr:
      backend: engine
      offload: true
      model_path: /models/ocr
      n_gpus_per_node: 2
      nnodes: 1
      rollout:
        name: vllm
        tensor_model_parallel_size: 2
    quality:
      backend: native
      offload: true
      model_path: /models/quality
      placement:
        devices: [2, 3]
      executor:
        model: my_package.reward_model:TransformersRewardModel
  reward_functions:
    ocr:
      path: pkg://my_package.ocr_reward
      name: compute_score
      weight: 0.4
    quality:
      path: pkg://my_package.reward_score
      name: compute_quality_score
      weight: 0.6
"""


def test_the_seeds_migrated_and_mixed_recipes_load_unchanged(tmp_path):
    """As the seed writes them (no `env:`: engine models default to env engine, native ones to
    env embed); the seed's own rules hold: engines take GPUs 0-1 first, the native model 2-3."""
    (tmp_path / "migrated.yaml").write_text(SEED_MIGRATED)
    (term,) = load_recipe(tmp_path / "migrated.yaml").train.terms
    assert (term.required, term.weight, term.backend.gpu_residency) == (True, 1.0, "per_call")
    assert term.backend.process.visible_devices == "0,1"
    assert term.backend.process.python_executable == env_python("engine")
    (tmp_path / "mixed.yaml").write_text(SEED_MIXED)
    ocr, quality = load_recipe(tmp_path / "mixed.yaml").train.terms
    assert (ocr.weight, ocr.required, quality.weight, quality.required) == (0.4, False, 0.6, False)
    assert quality.backend.replicas.devices == ["2", "3"]
    assert quality.backend.process.python_executable == env_python("embed")
    crowded = SEED_MIXED.replace("devices: [2, 3]", "devices: [1, 2]")
    (tmp_path / "crowded.yaml").write_text(crowded)
    with pytest.raises(ConfigError, match=r"device 1 is also ocr's"):
        load_recipe(tmp_path / "crowded.yaml")
    (tmp_path / "full.yaml").write_text(
        SEED_MIXED.replace("n_gpus_per_node: 4", "n_gpus_per_node: 3")
    )
    with pytest.raises(ConfigError, match=r"do not fit in the reward pool of 3 GPUs"):
        load_recipe(tmp_path / "full.yaml")


def _seed(**models: Any) -> dict[str, Any]:
    return {
        "reward": {
            "reward_model": {"enable": False, "enable_resource_pool": True, "n_gpus_per_node": 4},
            "models": models,
            "reward_functions": {
                name: {"path": "pkg://my_package.ocr_reward", "name": "compute_score"}
                for name in models
            },
        }
    }


def test_the_seeds_engine_recipes_validate_and_read_verl_omnis_rules():
    engine = {
        "backend": "engine",
        "offload": True,
        "model_path": "Qwen/Qwen3-VL-8B-Instruct",
        "n_gpus_per_node": 2,
        "nnodes": 1,
        "rollout": {"name": "vllm", "tensor_model_parallel_size": 2, "data_parallel_size": 1},
    }
    (term,) = load_recipe(_seed(ocr=engine)).train.terms
    backend = term.backend
    assert term.required is False and backend.gpu_residency == "per_call"
    assert backend.process.visible_devices == "0,1" and backend.process.allow_multiple_gpus
    params = backend.scorer.params
    assert params["model_name"] == "Qwen/Qwen3-VL-8B-Instruct"
    assert params["command"][:3] == ["{bin}/vllm", "serve", "Qwen/Qwen3-VL-8B-Instruct"]
    assert "--enable-sleep-mode" in params["command"]
    assert params["engine_env"] == {"VLLM_SERVER_DEV_MODE": "1"}
    # inherited: model_path and rollout from reward.reward_model; two single-GPU replicas
    recipe = _seed(ocr={"backend": "engine", "n_gpus_per_node": 2})
    recipe["reward"]["reward_model"].update(model_path="/models/ocr", rollout={"dtype": "bfloat16"})
    backend = load_recipe(recipe).train.terms[0].backend
    assert backend.replicas.devices == ["0", "1"]
    assert backend.scorer.params["command"][2] == "/models/ocr"
    assert "bfloat16" in backend.scorer.params["command"]
    # engines take the first GPUs: a native model may not list them
    native = {"backend": "native", "env": "embed", "placement": {"devices": [1]}}
    native["executor"] = {"model": "m:Model"}
    with pytest.raises(ConfigError, match=r"device 1 is also ocr's"):
        load_recipe(_seed(ocr=engine, quality=native))
    # an inherited TP=2 takes GPUs 0-1 too; verl's own rollout keys, inherited, are not ours
    inherited = _seed(ocr={"backend": "engine", "model_path": "/m"}, quality=native)
    inherited["reward"]["reward_model"]["rollout"] = {
        "tensor_model_parallel_size": 2,
        "load_format": "dummy",
        "free_cache_engine": True,
    }
    with pytest.raises(ConfigError, match=r"device 1 is also ocr's"):
        load_recipe(inherited)
    del inherited["reward"]["models"]["quality"], inherited["reward"]["reward_functions"]["quality"]
    command = load_recipe(inherited).train.terms[0].backend.scorer.params["command"]
    assert "load_format" not in " ".join(command) and "2" in command
    with pytest.raises(ConfigError, match=r"reward_model.enable: true with reward.models"):
        bad = _seed(ocr=engine)
        bad["reward"]["reward_model"]["enable"] = True
        load_recipe(bad)
    with pytest.raises(ConfigError, match=r"must be a multiple of the replica size"):
        load_recipe(_seed(ocr={**engine, "n_gpus_per_node": 3}))
    with pytest.raises(ConfigError, match=r"give `command:`"):
        load_recipe(_seed(ocr={**engine, "rollout": {"name": "sglang"}}))


def test_an_engine_models_functions_must_name_path_and_name():
    recipe = _seed(ocr={"backend": "engine", "device": "cpu", "model_path": "/m"})
    recipe["reward"]["reward_functions"]["ocr"] = {"weight": 1.0}
    with pytest.raises(ConfigError, match=r"an engine model's reward function needs `path`"):
        load_recipe(recipe)


def test_sleep_endpoints_keep_the_engine_and_one_that_died_asleep_is_started_anew(tmp_path):
    """vLLM's sleep mode, through a protocol double (no vLLM here): sleep and wake are requests,
    the engine process stays between calls; killed while asleep, the next call starts it again."""
    from tests.helpers.engine_models import parse_score

    journal = tmp_path / "journal.txt"
    double = REPO_ROOT / "tests" / "helpers" / "sleepy_engine.py"
    model = {
        "backend": "engine",
        "device": "cpu",
        "model_path": "sleepy",
        "command": ["{python}", str(double), "{model_path}", "{port}", str(journal)],
        "ready_timeout_s": 30,
    }
    recipe = {
        "reward": {
            "models": {"ocr": model},
            "reward_functions": {"ocr": {"path": str(HELPER), "name": "compute_score"}},
        }
    }
    train, _ = build_panels(load_recipe(recipe))
    try:
        request = RewardRequest(items=_items()[:2])
        first = train.compute_rewards(request)
        assert all(0 <= value < 1 for value in first.rewards)
        assert parse_score("yes") in first.rewards or parse_score("yes yes") in first.rewards
        assert journal.read_text().split() == ["/sleep", "/wake_up", "/sleep"]  # boot, call
        (engine,) = _engines(double)
        assert train.compute_rewards(request).rewards == first.rewards
        assert _engines(double) == [engine]  # the same process, slept and woken
        engine.kill()  # asleep
        again = train.compute_rewards(request)  # a fresh start, counted
        assert again.rewards == first.rewards
        assert again.diagnostics["ocr"]["values"]["engine_restarts"] == 1
        (fresh,) = _engines(double)
        assert fresh.pid != engine.pid
    finally:
        train.close()
    assert _engines(double) == []
