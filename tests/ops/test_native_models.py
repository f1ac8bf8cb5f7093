"""verl-omni named native models (`backend: native`), each in managed children of env embed with
its score functions beside it: equal to calling the same classes and functions in-process, terms
sharing a model share its child, replicas split the batch, offload really lets the instance go,
optional and required failures, and the lifecycle failure that is always fatal."""

from __future__ import annotations

import json
import re
import subprocess
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from supervisor import (
    ConfigError,
    ManagedScorerProcessBackend,
    RewardItem,
    RewardRequest,
    ScorerItemsFailed,
    ScorerRequestError,
    ScorerTimeout,
    build_panels,
    load_recipe,
)
from supervisor.compose.replicas import ReplicatedBackend
from tests.conftest import REPO_ROOT, env_python, launcher_free_env, wait_until_gone
from tests.helpers.native_models import images

HELPER = REPO_ROOT / "tests" / "helpers" / "native_models.py"
WEIGHTS = {"quality": 1.0, "semantic": 0.5, "flaky": 0.25, "aesthetic": 2.0}
COUNT = 4


def _metadata(count: int = COUNT) -> list[dict[str, Any]]:
    return [{"uid": f"i{i}", "flaky": i == 1} for i in range(count)]


def _references(count: int = COUNT) -> list[str]:
    return ["a red cat"[: 3 + i] for i in range(count)]


def _items() -> list[RewardItem]:
    return [
        RewardItem(id=meta["uid"], image=image, reference=gt, metadata=meta, data_source="d")
        for image, meta, gt in zip(images(COUNT), _metadata(), _references(), strict=True)
    ]


@pytest.fixture(scope="module")
def in_process(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, list[Any]]]:
    """The weights (saved by the same helper) and each term's value, computed in env embed's
    python."""
    out = tmp_path_factory.mktemp("native")
    arrays = {f"image{i}": image for i, image in enumerate(images(COUNT))}
    spec = json.dumps({"metadata": _metadata(), "references": _references()})
    np.savez(out / "inputs.npz", spec=np.array(spec), **arrays)
    done = subprocess.run(
        [str(env_python("embed")), str(HELPER), str(out), str(out / "inputs.npz")],
        env=launcher_free_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return out, json.loads(done.stdout.splitlines()[-1])


def _recipe(weights: Path, offload: bool, trace: Path) -> dict[str, Any]:
    native = {"backend": "native", "env": "embed", "offload": offload}
    recipe: dict[str, Any] = {
        "reward": {
            "reward_manager": {"name": "MultiVisualRewardManager"},
            "models": {
                "quality": {
                    **native,
                    "model_path": str(weights / "quality.pt"),
                    "placement": {"devices": ["cpu"]},
                    "executor": {"model": f"{HELPER}:QualityModel", "kwargs": {"scale": 1.5}},
                },
                "aesthetic": {
                    **native,
                    "model_path": str(weights / "aesthetic.pt"),
                    "placement": {"devices": ["cpu", "cpu"]},
                    "executor": {"model": "pkg://tests.helpers.native_models:AestheticModel"},
                    "extra_import_paths": [str(REPO_ROOT)],
                },
            },
            "reward_functions": {
                "quality": {
                    "path": str(HELPER),
                    "name": "quality_score",
                    "required": True,
                    "log_keys": ["builds"],
                },
                "semantic": {
                    "model": "quality",
                    "path": str(HELPER),
                    "name": "semantic_score",
                    "scale": 2.0,
                    "unused": "filtered out",
                },
                "flaky": {
                    "model": "quality",
                    "path": str(HELPER),
                    "name": "flaky_score",
                    "bias": 0.5,
                },
                "aesthetic": {
                    "path": "pkg://tests.helpers.native_models",
                    "name": "aesthetic_score",
                    "required": True,
                    "trace_dir": str(trace),
                },
            },
        }
    }
    for term, weight in WEIGHTS.items():
        recipe["reward"]["reward_functions"][term]["weight"] = weight
    return recipe


def _weighted(values: dict[str, list[Any]]) -> list[float]:
    return [
        sum(WEIGHTS[term] * values[term][i] for term in WEIGHTS if values[term][i] is not None)
        for i in range(COUNT)
    ]


@pytest.mark.slow
@pytest.mark.parametrize("offload", [True, False], ids=["offload", "resident"])
def test_native_models_score_beside_their_functions_as_in_process(in_process, tmp_path, offload):
    weights, expected = in_process
    recipe = load_recipe(_recipe(weights, offload, tmp_path))
    assert recipe.style == "verl-omni"
    train, _ = build_panels(recipe)
    try:
        quality, semantic, flaky, aesthetic = (term.backend for term in train.terms)
        # one child
        assert quality is semantic is flaky and isinstance(quality, ManagedScorerProcessBackend)
        assert isinstance(aesthetic, ReplicatedBackend) and len(aesthetic.replicas) == 2
        assert quality.spec.gpu_residency == ("per_call" if offload else "resident")
        request = RewardRequest(items=_items())
        first = train.compute_rewards(request)
        # the same floats
        assert {term: first.component_rewards[term] for term in WEIGHTS} == expected
        assert first.rewards == pytest.approx(_weighted(expected), rel=1e-12)
        (failure,) = first.term_failures  # the optional term alone, for its one item
        assert (failure.term, failure.ids) == ("flaky", ["i1"]) and "flaky item" in failure.error
        assert (
            first.successes == [True, False, True, True]
            and first.component_rewards["flaky"][1] is None
        )
        # each replica of aesthetic got its half (its calls run concurrently)
        seen = defaultdict(set)
        for line in (tmp_path / "trace.txt").read_text().splitlines():
            pid, uid = line.split()
            seen[int(pid)].add(uid)
        assert dict(seen) == {aesthetic.pids[0]: {"i0", "i1"}, aesthetic.pids[1]: {"i2", "i3"}}
        second = train.compute_rewards(request)
        assert second.rewards == first.rewards
        _check_residency(second.diagnostics, offload)
        poisoned = RewardItem(
            id="p0", image=images(1)[0], metadata={"uid": "p0", "poison": True}, data_source="d"
        )
        with pytest.raises(
            ScorerItemsFailed,
            match=r"required term .quality. failed for 1 items: reward function .quality. failed "
            r"on item .p0.*poisoned",
        ) as e:
            train.compute_rewards(RewardRequest(items=[poisoned]))
        assert e.value.pid == quality.pid and f"pid={quality.pid}" in str(e.value)
        assert train.compute_rewards(request).rewards == first.rewards  # the child keeps serving
    finally:
        train.close()


def _check_residency(diagnostics: dict[str, Any], offload: bool) -> None:
    """With offload, the instance each previous call slept is gone when the next call starts (its
    weak reference cleared, none of its tensors alive); resident, one instance serves every call."""
    values = diagnostics["quality"]["values"]
    replicas = diagnostics["aesthetic"]["values"]
    print(
        f"offload={offload}: rss_bytes quality {values['rss_bytes']}, aesthetic "
        f"{replicas['rss_bytes']}"
    )
    builds = values["quality.builds"]
    if offload:
        assert values["slept_instance_alive"] == 0 and values["slept_param_bytes_alive"] == 0
        # what the slept instance held: its ballast too
        assert values["slept_param_bytes"] >= 8_000_000
        assert replicas["slept_instance_alive"] == 0 and replicas["slept_param_bytes_alive"] == 0
        # woken anew from __init__ for the second call
        assert builds["sum"] / builds["count"] == 2.0
    else:
        assert "slept_instance_alive" not in values and "slept_instance_alive" not in replicas
        assert builds["sum"] / builds["count"] == 1.0


@pytest.mark.slow
def test_a_model_that_cannot_wake_fails_the_call_even_with_optional_terms_only(
    in_process, tmp_path
):
    weights, _ = in_process
    model = {"backend": "native", "env": "embed", "model_path": str(weights / "quality.pt")}
    model.update(placement={"devices": ["cpu"]}, executor={"model": f"{HELPER}:FragileModel"})
    recipe = {
        "reward": {
            "models": {"fragile": model},
            "reward_functions": {"fragile": {"path": str(HELPER), "name": "semantic_score"}},
        }
    }
    train, _ = build_panels(load_recipe(recipe))
    try:
        request = RewardRequest(items=_items()[:1])
        assert train.compute_rewards(request).successes == [True]
        with pytest.raises(
            ScorerRequestError, match=r"residency_failed.*per-call onload.*cannot wake twice"
        ) as e:
            train.compute_rewards(request)
        assert any("lifecycle failure" in note for note in e.value.__notes__)
    finally:
        train.close()


def _native(**changes: Any) -> dict[str, Any]:
    model = {
        "backend": "native",
        "env": "embed",
        "placement": {"devices": [0]},
        "executor": {"model": "m:Model"},
    }
    model.update(changes)
    return {
        "reward": {
            "models": {"q": model},
            "reward_functions": {"q": {"path": "pkg://m", "name": "score"}},
        }
    }


def test_a_native_model_recipe_reads_verl_omnis_defaults_and_refuses_what_it_cannot_place():
    recipe = load_recipe(_native())
    (term,) = recipe.train.terms
    assert term.required is False and term.component == "q"  # verl-omni's default: optional
    backend = term.backend
    # offload: true by default
    assert backend.gpu_residency == "per_call" and backend.scorer.device == "cuda"
    assert backend.replicas.devices == ["0"]
    assert load_recipe(_native(offload=False)).train.terms[0].backend.gpu_residency == "resident"
    with pytest.raises(ConfigError, match=r"all GPU indices .* or all cpu, not a mix"):
        load_recipe(_native(placement={"devices": [0, "cpu"]}))
    with pytest.raises(ConfigError, match=r"placement.devices lists one entry per replica"):
        load_recipe(_native(placement={}))
    with pytest.raises(ConfigError, match=r"say which scorer env"):
        load_recipe(_native(env=None))
    with pytest.raises(ConfigError, match=r"unknown keys \['scorer'\]"):
        load_recipe(_native(scorer="x"))
    two = _native()
    two["reward"]["models"]["r"] = two["reward"]["models"]["q"]
    with pytest.raises(ConfigError, match=r"device 0 is also q's"):
        load_recipe(two)
    missing = _native()
    missing["reward"]["reward_functions"]["q"] = {"weight": 1.0}
    with pytest.raises(ConfigError, match=r"needs `path` and `name`"):
        load_recipe(missing)


FAULTS = REPO_ROOT / "tests" / "helpers" / "term_faults.py"


def _faulty(model: str, function: str, **changes: Any) -> dict[str, Any]:
    """One native model of tests/helpers/term_faults.py (env embed, one cpu replica) and one
    function."""
    native = {
        "backend": "native",
        "env": "embed",
        "placement": {"devices": ["cpu"]},
        "executor": {"model": model},
    }
    native["extra_import_paths"] = [str(REPO_ROOT)]
    return {**native, **changes, "function": {"path": str(FAULTS), "name": function}}


def _faulty_recipe(**models: dict[str, Any]) -> dict[str, Any]:
    functions = {
        name: {**model.pop("function"), "required": model.pop("required", False)}
        for name, model in models.items()
    }
    return {"reward": {"models": models, "reward_functions": functions}}


def _image_items(prefix: str, **metadata: Any) -> list[RewardItem]:
    return [
        RewardItem(id=f"{prefix}{i}", image=image, metadata=dict(metadata), data_source="d")
        for i, image in enumerate(images(2))
    ]


@pytest.mark.slow
def test_a_native_call_past_its_deadline_restarts_the_child_and_the_next_call_is_served():
    """A sync score function stuck on its thread past call_timeout_s: the call fails once, typed
    (ScorerTimeout: the child answered `wedged`), the child is killed with the stuck thread, and the
    next call is served by a restarted child (item 4: every later call failed at once, same pid)."""
    hang = _faulty(
        "pkg://tests.helpers.term_faults:Tiny", "hanging_score", call_timeout_s=1.0, required=True
    )
    train, _ = build_panels(load_recipe(_faulty_recipe(hang=hang)))
    try:
        backend = train.terms[0].backend
        stuck = backend.pid
        with pytest.raises(
            ScorerTimeout, match=r"\(wedged\).*did not finish within call_timeout_s=1.0"
        ) as e:
            train.compute_rewards(RewardRequest(items=_image_items("h", hang=True)))
        assert e.value.pid == stuck
        assert wait_until_gone([stuck], 10) == []
        served = train.compute_rewards(RewardRequest(items=_image_items("s")))
        assert len(served.rewards) == 2 and served.successes == [True, True]
        assert backend.pid != stuck and backend.restarts == 1
    finally:
        train.close()


@pytest.mark.slow
def test_a_close_that_raises_after_releasing_the_model_is_a_failed_close_not_a_failed_offload():
    """A model whose close() raises once it let go of its weights (item 11): per call, the optional
    term records `close_failed` and the step goes on (a failed residency change would be fatal), the
    child says offloaded, not unknown, and wakes a new instance for the next call; resident, an
    explicit offload raises `close_failed`, and the child is offloaded and onloads again."""
    per_call = _faulty("pkg://tests.helpers.term_faults:ClosesBadly", "hanging_score")
    resident = _faulty(
        "pkg://tests.helpers.term_faults:ClosesBadly", "hanging_score", offload=False
    )
    train, _ = build_panels(load_recipe(_faulty_recipe(per_call=per_call, resident=resident)))
    try:
        per_call_backend, resident_backend = (term.backend for term in train.terms)
        for _ in range(2):  # each call wakes a new instance; each sleep's close() raises
            got = train.compute_rewards(RewardRequest(items=_image_items("c")))
            (failure,) = got.term_failures
            assert failure.term == "per_call" and failure.kind == "ScorerRequestError", failure
            assert "(close_failed)" in failure.error and "released all the same" in failure.error, (
                failure.error
            )
            assert re.search(r"asleep: 0 of 4004032 parameter bytes still alive", failure.error), (
                failure.error
            )
            assert got.component_rewards["resident"][0] is not None
            assert per_call_backend.health()["residency"] == "offloaded"
        with pytest.raises(
            ScorerRequestError, match=r"\(close_failed\).*close\(\) broke after it released"
        ) as e:
            resident_backend.offload()
        assert (
            e.value.kind == "close_failed" and resident_backend.health()["residency"] == "offloaded"
        )
        resident_backend.onload()
        assert (
            train.compute_rewards(RewardRequest(items=_image_items("r"))).component_rewards[
                "resident"
            ][1]
            is not None
        )
        assert per_call_backend.restarts == resident_backend.restarts == 0
    finally:
        train.close()
