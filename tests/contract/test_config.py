"""Config models (plain dicts and Hydra `_target_` recipes) and the per-rank GPU choice."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import OmegaConf
from pydantic import ValidationError

from supervisor import (
    ClientConfig,
    ConfigError,
    ManagedScorerProcessBackend,
    ManagedScorerProcessSpec,
    ProcessConfig,
    ScorerConfig,
)
from supervisor.child.gpu import child_visible_devices

PY = sys.executable
REPO_ROOT = Path(__file__).resolve().parents[2]


def spec_dict(
    process: dict | None = None, scorer: dict | None = None, client: dict | None = None, **top
) -> dict:
    data = {
        "process": {"python_executable": PY, **(process or {})},
        "scorer": {"name": "exact_match", **(scorer or {})},
        **top,
    }
    if client is not None:
        data["client"] = client
    return data


def invalid(data: dict, *fragments: str) -> str:
    with pytest.raises(ValidationError) as info:
        ManagedScorerProcessSpec(**data)
    text = str(info.value)
    for fragment in fragments:
        assert fragment in text, f"{fragment!r} not in:\n{text}"
    return text


# -- plain construction ----------------------------------------------------------------------
def test_valid_spec_from_nested_dicts():
    spec = ManagedScorerProcessSpec(
        **spec_dict(
            process={
                "startup_timeout": 30,
                "request_timeout": 5.5,
                "env": {"HF_HOME": "/tmp/hf"},
                "local_rank": 2,
                "log_dir": "/tmp/logs",
            },
            scorer={
                "name": "jpeg_compressibility",
                "input_kind": "image",
                "params": {"quality": 80},
                "device": "cuda",
            },
            client={
                "input_kind": "image",
                "required_rewards": ["jpeg_compressibility"],
                "weights": {"jpeg_compressibility": 0.5},
                "request_batch_size": 8,
            },
            gpu_residency="per_call",
        )
    )
    assert isinstance(spec.process, ProcessConfig)
    assert isinstance(spec.scorer, ScorerConfig)
    assert isinstance(spec.client, ClientConfig)
    assert spec.process.python_executable == Path(PY)
    assert spec.process.extra_import_paths == []
    assert spec.process.startup_timeout == 30.0 and spec.process.request_timeout == 5.5
    assert spec.process.env == {"HF_HOME": "/tmp/hf"}
    assert spec.process.local_rank == 2 and spec.process.log_dir == Path("/tmp/logs")
    assert spec.scorer.name == "jpeg_compressibility" and spec.scorer.params == {"quality": 80}
    assert spec.scorer.device == "cuda"
    assert (
        spec.client.weights == {"jpeg_compressibility": 0.5} and spec.client.request_batch_size == 8
    )
    assert spec.gpu_residency == "per_call"


def test_defaults():
    spec = ManagedScorerProcessSpec(**spec_dict())
    assert spec.gpu_residency == "resident"
    assert spec.scorer.input_kind == "text" and spec.client.input_kind == "text"
    assert spec.scorer.params == {} and spec.scorer.device == "cpu" and spec.scorer.revision is None
    assert spec.client.required_rewards == [] and spec.client.weights == {}
    assert spec.client.request_batch_size == 64
    p = spec.process
    assert (p.startup_timeout, p.request_timeout, p.shutdown_timeout) == (120.0, 600.0, 10.0)
    assert (
        p.env == {}
        and p.local_rank is None
        and p.visible_devices is None
        and p.allow_multiple_gpus is False
    )


def test_spec_is_frozen():
    spec = ManagedScorerProcessSpec(**spec_dict())
    with pytest.raises(ValidationError):
        spec.gpu_residency = "per_call"
    with pytest.raises(ValidationError):
        spec.client.request_batch_size = 1


def test_nonexistent_python_executable(tmp_path):
    missing = tmp_path / "envs" / "nope" / ".venv" / "bin" / "python"
    invalid(
        spec_dict(process={"python_executable": str(missing)}),
        "process.python_executable",
        str(missing),
        "is not an executable file",
    )


def test_non_executable_python_file(tmp_path):
    script = tmp_path / "python"
    script.write_text("#!/bin/sh\n")
    script.chmod(0o644)
    invalid(
        spec_dict(process={"python_executable": str(script)}),
        "process.python_executable",
        "not an executable",
    )


def test_missing_python_executable_key():
    invalid(
        {"process": {}, "scorer": {"name": "x"}},
        "the child needs a python",
        "env (a scorer env by name",
    )


def test_a_scorer_env_by_name_or_the_one_the_scorer_declares(monkeypatch, tmp_path):
    from supervisor import scorer_envs

    math = scorer_envs.env_python("math")  # the checkout's envs/ (make envs built it)
    assert (
        ManagedScorerProcessSpec(
            env="math", scorer={"name": "math_verify"}
        ).process.python_executable
        == math
    )
    # math_verify declares env "math"
    declared = ManagedScorerProcessSpec(scorer={"name": "math_verify"})
    assert declared.process.python_executable == math and declared.env == "math"
    invalid(
        {"env": "nosuch", "scorer": {"name": "exact_match"}},
        "no scorer env 'nosuch'",
        "no spec of that name",
    )
    invalid(spec_dict(env="math"), "not both")
    # a dump reads back
    assert ManagedScorerProcessSpec.model_validate(declared.model_dump()) == declared
    assert ManagedScorerProcessSpec.model_validate_json(declared.model_dump_json()) == declared
    monkeypatch.setenv(scorer_envs.ROOT_VARIABLE, str(tmp_path))
    invalid(
        {"env": "image", "scorer": {"name": "exact_match"}},
        "is not built",
        "managed-scorers envs build image",
    )


@pytest.mark.parametrize("field", ["startup_timeout", "request_timeout", "shutdown_timeout"])
@pytest.mark.parametrize("value", [0, -1.5])
def test_timeouts_must_be_positive(field, value):
    invalid(spec_dict(process={field: value}), f"process.{field}", "greater than 0")


@pytest.mark.parametrize("value", [0, -4])
def test_request_batch_size_must_be_positive(value):
    invalid(
        spec_dict(client={"request_batch_size": value}),
        "client.request_batch_size",
        "greater than 0",
    )


def test_negative_local_rank():
    invalid(
        spec_dict(process={"local_rank": -1}), "process.local_rank", "greater than or equal to 0"
    )


@pytest.mark.parametrize(
    "data,loc",
    [
        ({**spec_dict(), "procss": {}}, "procss"),
        (spec_dict(process={"startup_timout": 3}), "process.startup_timout"),
        (spec_dict(scorer={"parms": {}}), "scorer.parms"),
        (spec_dict(client={"weight": {}}), "client.weight"),
    ],
    ids=["top", "process", "scorer", "client"],
)
def test_unknown_keys_are_forbidden(data, loc):
    invalid(data, loc, "Extra inputs are not permitted")


def test_gpu_residency_must_be_known():
    invalid(spec_dict(gpu_residency="sometimes"), "gpu_residency", "'resident'", "'per_call'")


def test_input_kind_must_be_known():
    invalid(spec_dict(scorer={"input_kind": "smell"}), "scorer.input_kind")


def test_input_kind_mismatch_between_client_and_scorer():
    invalid(
        spec_dict(scorer={"input_kind": "image"}, client={"input_kind": "text"}),
        "client.input_kind 'text' != scorer.input_kind 'image'",
    )
    # no client kind: the scorer's
    follows = ManagedScorerProcessSpec(**spec_dict(scorer={"input_kind": "video"}))
    assert follows.client.input_kind == "video"


def test_input_kind_defaults_to_the_one_the_scorer_declares():
    image = ManagedScorerProcessSpec(**spec_dict(scorer={"name": "jpeg_compressibility"}))
    assert image.scorer.input_kind == "image" and image.client.input_kind == "image"
    unknown_here = ManagedScorerProcessSpec(**spec_dict(scorer={"name": "only_in_its_env:Scorer"}))
    # a class this python cannot import: text, unless given
    assert unknown_here.scorer.input_kind == "text"


def test_weights_must_name_required_rewards():
    invalid(
        spec_dict(
            client={"required_rewards": ["a", "b"], "weights": {"a": 1.0, "c": 2.0, "d": 0.5}}
        ),
        "client",
        "weights name rewards not in required_rewards: ['c', 'd']",
    )
    ok = ManagedScorerProcessSpec(
        **spec_dict(client={"required_rewards": ["a", "b"], "weights": {"b": 3}})
    )
    assert ok.client.weights == {"b": 3.0}


def test_extra_import_paths_are_existing_directories_made_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine").mkdir()
    spec = ManagedScorerProcessSpec(**spec_dict(process={"extra_import_paths": ["mine"]}))
    assert spec.process.extra_import_paths == [tmp_path / "mine"]
    invalid(
        spec_dict(process={"extra_import_paths": ["nowhere"]}),
        "extra_import_paths must be existing directories",
        str(tmp_path / "nowhere"),
    )


@pytest.mark.parametrize("name", ["PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSAFEPATH"])
def test_env_cannot_change_the_childs_import_path(name):
    invalid(
        spec_dict(process={"env": {name: "/somewhere"}}),
        f"env may not set ['{name}']",
        "extra_import_paths",
    )


def test_a_relative_python_is_resolved_once_against_the_current_directory(tmp_path, monkeypatch):
    venv_bin = tmp_path / "env" / "bin"
    venv_bin.mkdir(parents=True)
    # a venv's python is a symlink: it must be kept, not resolved
    (venv_bin / "python").symlink_to(PY)
    monkeypatch.chdir(tmp_path)
    spec = ManagedScorerProcessSpec(**spec_dict(process={"python_executable": "env/bin/python"}))
    assert spec.process.python_executable == venv_bin / "python"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    invalid(
        spec_dict(process={"python_executable": "env/bin/python"}),
        str(elsewhere / "env/bin/python"),
        f"resolved against the current directory {elsewhere}",
    )


def test_scorer_name_must_be_non_empty():
    invalid(spec_dict(scorer={"name": ""}), "scorer.name")


def test_sub_models_accept_instances():
    process = ProcessConfig(python_executable=PY)
    scorer = ScorerConfig(name="nonempty")
    spec = ManagedScorerProcessSpec(process=process, scorer=scorer)
    assert spec.process is process and spec.scorer is scorer


def test_required_rewards_default_is_empty_and_the_backend_keeps_explicit_ones():
    default = ManagedScorerProcessBackend(spec_dict(), start=False)
    assert default.spec.client.required_rewards == []
    assert default.pid is None
    explicit = ManagedScorerProcessBackend(
        spec_dict(client={"required_rewards": ["exact_match"]}), start=False
    )
    assert explicit.required_rewards == ["exact_match"]
    default.close()
    explicit.close()


# -- Hydra recipes ---------------------------------------------------------------------------
SPEC_RECIPE = f"""
_target_: supervisor.ManagedScorerProcessSpec
process:
  python_executable: {PY}
  startup_timeout: 45
  env:
    OMP_NUM_THREADS: "1"
  local_rank: 1
scorer:
  name: jpeg_incompressibility
  input_kind: image
  params:
    quality: 90
  revision: ddpo-q95
client:
  input_kind: image
  required_rewards: [jpeg_incompressibility]
  weights:
    jpeg_incompressibility: 2.0
  request_batch_size: 16
gpu_residency: per_call
"""

NESTED_TARGET_RECIPE = f"""
_target_: supervisor.ManagedScorerProcessSpec
process:
  _target_: supervisor.ProcessConfig
  python_executable: {PY}
  shutdown_timeout: 3
scorer:
  _target_: supervisor.ScorerConfig
  name: exact_match
  params:
    case_sensitive: true
client:
  _target_: supervisor.ClientConfig
  required_rewards: [exact_match]
  request_batch_size: 4
"""


def check_recipe_spec(spec) -> None:
    assert type(spec) is ManagedScorerProcessSpec
    assert spec.process.python_executable == Path(PY)
    assert spec.process.startup_timeout == 45.0
    assert spec.process.env == {"OMP_NUM_THREADS": "1"} and type(spec.process.env) is dict
    assert spec.process.local_rank == 1
    assert spec.scorer.name == "jpeg_incompressibility" and spec.scorer.input_kind == "image"
    assert spec.scorer.params == {"quality": 90} and type(spec.scorer.params) is dict
    assert spec.scorer.revision == "ddpo-q95"
    assert spec.client.required_rewards == ["jpeg_incompressibility"]
    assert type(spec.client.required_rewards) is list
    assert spec.client.weights == {"jpeg_incompressibility": 2.0}
    assert spec.client.request_batch_size == 16
    assert spec.gpu_residency == "per_call"


def test_hydra_builds_the_spec_from_a_recipe():
    check_recipe_spec(instantiate(OmegaConf.create(SPEC_RECIPE)))


def test_hydra_recipe_with_nested_targets():
    spec = instantiate(OmegaConf.create(NESTED_TARGET_RECIPE))
    assert type(spec) is ManagedScorerProcessSpec
    assert type(spec.process) is ProcessConfig and type(spec.scorer) is ScorerConfig
    assert type(spec.client) is ClientConfig
    assert spec.process.python_executable == Path(PY) and spec.process.shutdown_timeout == 3.0
    assert spec.scorer.name == "exact_match" and spec.scorer.params == {"case_sensitive": True}
    assert spec.client.required_rewards == ["exact_match"] and spec.client.request_batch_size == 4


def test_hydra_recipe_with_a_list_param_gives_plain_lists():
    recipe = OmegaConf.create(SPEC_RECIPE)
    recipe.scorer.params = {"sizes": [1, [2, 3]], "nested": {"a": [True]}}
    spec = instantiate(recipe)
    assert spec.scorer.params == {"sizes": [1, [2, 3]], "nested": {"a": [True]}}
    assert type(spec.scorer.params["sizes"]) is list and type(spec.scorer.params["nested"]) is dict


@pytest.mark.parametrize(
    "recipe,typo,field",
    [
        (SPEC_RECIPE, ("startup_timeout: 45", "startup_timout: 45"), "startup_timout"),
        (SPEC_RECIPE, ("gpu_residency: per_call", "gpu_residencey: per_call"), "gpu_residencey"),
        (SPEC_RECIPE, ("\nprocess:", "\nprocss:"), "procss"),
        (NESTED_TARGET_RECIPE, ("shutdown_timeout: 3", "shutdown_timout: 3"), "shutdown_timout"),
        (
            NESTED_TARGET_RECIPE,
            ("request_batch_size: 4", "request_batchsize: 4"),
            "request_batchsize",
        ),
    ],
    ids=[
        "process-field",
        "top-field",
        "top-section",
        "nested-target-process",
        "nested-target-client",
    ],
)
def test_hydra_recipe_typo_names_the_field(recipe, typo, field):
    bad = recipe.replace(*typo)
    assert bad != recipe
    with pytest.raises(InstantiationException) as info:
        instantiate(OmegaConf.create(bad))
    assert field in str(info.value)
    assert "Extra inputs are not permitted" in str(info.value)


def test_hydra_recipe_bad_value_names_the_field():
    bad = SPEC_RECIPE.replace("request_batch_size: 16", "request_batch_size: 0")
    with pytest.raises(InstantiationException, match="client.request_batch_size"):
        instantiate(OmegaConf.create(bad))


def test_hydra_builds_the_backend_without_starting_a_child():
    body = "\n".join("  " + line for line in SPEC_RECIPE.strip().splitlines()[1:])
    recipe = f"_target_: supervisor.ManagedScorerProcessBackend\nstart: false\nspec:\n{body}\n"
    backend = instantiate(OmegaConf.create(recipe))
    try:
        assert type(backend) is ManagedScorerProcessBackend
        check_recipe_spec(backend.spec)
        assert backend.pid is None and backend.log_path is None and backend.ready_info == {}
        assert backend.required_rewards == ["jpeg_incompressibility"]
        with pytest.raises(RuntimeError, match="start=False"):
            backend.health()
    finally:
        backend.close()


def test_hydra_backend_with_nested_spec_target():
    body = "\n".join("  " + line for line in NESTED_TARGET_RECIPE.strip().splitlines())
    recipe = f"_target_: supervisor.ManagedScorerProcessBackend\nstart: false\nspec:\n{body}\n"
    backend = instantiate(OmegaConf.create(recipe))
    try:
        assert type(backend.spec) is ManagedScorerProcessSpec
        assert backend.spec.scorer.params == {"case_sensitive": True}
    finally:
        backend.close()


# -- child_visible_devices -------------------------------------------------------------------
@pytest.mark.parametrize("rank", [0, 1, 5])
def test_parent_sees_all_gpus_rank_picks_the_index(rank):
    assert child_visible_devices({}, rank) == str(rank)


def test_parent_list_is_indexed_by_local_rank():
    env = {"CUDA_VISIBLE_DEVICES": "3,5,7"}
    assert child_visible_devices(env, 0) == "3"
    assert child_visible_devices(env, 1) == "5"
    assert child_visible_devices(env, 2) == "7"
    assert child_visible_devices({"CUDA_VISIBLE_DEVICES": " 3 , 5 ,7 "}, 1) == "5"


def test_parent_uuids_are_passed_through():
    env = {"CUDA_VISIBLE_DEVICES": "GPU-aaaa,GPU-bbbb"}
    assert child_visible_devices(env, 1) == "GPU-bbbb"


def test_local_rank_env_var_used_when_rank_is_none():
    assert child_visible_devices({"CUDA_VISIBLE_DEVICES": "3,5,7", "LOCAL_RANK": "2"}, None) == "7"
    assert child_visible_devices({"LOCAL_RANK": "4"}, None) == "4"
    assert child_visible_devices({}, None) == "0"
    # an explicit local_rank beats the env var
    assert child_visible_devices({"CUDA_VISIBLE_DEVICES": "3,5,7", "LOCAL_RANK": "2"}, 0) == "3"


def test_rank_beyond_the_parent_list():
    with pytest.raises(
        ConfigError, match=r"local rank 3 has no GPU in CUDA_VISIBLE_DEVICES='3,5,7'"
    ):
        child_visible_devices({"CUDA_VISIBLE_DEVICES": "3,5,7"}, 3)
    with pytest.raises(ConfigError, match="local rank 2"):
        child_visible_devices({"CUDA_VISIBLE_DEVICES": "0,1", "LOCAL_RANK": "2"}, None)


def test_parent_with_one_gpu_gives_that_gpu_whatever_the_rank():
    # a launcher that already narrowed each rank to its GPU: rank 3 still gets the one it sees
    assert child_visible_devices({"CUDA_VISIBLE_DEVICES": "6"}, 0) == "6"
    assert child_visible_devices({"CUDA_VISIBLE_DEVICES": "6"}, 3) == "6"
    assert child_visible_devices({"CUDA_VISIBLE_DEVICES": "6,", "LOCAL_RANK": "2"}, None) == "6"


def test_parent_hides_all_gpus():
    assert child_visible_devices({"CUDA_VISIBLE_DEVICES": ""}, 0) == ""
    assert child_visible_devices({"CUDA_VISIBLE_DEVICES": ""}, 3) == ""


def test_explicit_wins():
    assert child_visible_devices({"CUDA_VISIBLE_DEVICES": "3,5,7"}, 1, explicit="2") == "2"
    assert child_visible_devices({}, 4, explicit=" 2 ") == "2"


def test_explicit_multiple_needs_allow_multiple():
    with pytest.raises(
        ConfigError, match=r"visible_devices='0,1' names 2 GPUs.*allow_multiple_gpus"
    ):
        child_visible_devices({}, 0, explicit="0,1")
    assert child_visible_devices({}, 0, explicit="0, 1", allow_multiple=True) == "0,1"


def test_config_error_is_a_value_error():
    assert issubclass(ConfigError, ValueError)


@pytest.mark.parametrize(
    "env",
    [
        {"CUDA_VISIBLE_DEVICES": "3,5,7", "LOCAL_RANK": "-1"},
        {"LOCAL_RANK": "-1"},
        {"CUDA_VISIBLE_DEVICES": "3,5,7", "LOCAL_RANK": "one"},
    ],
    ids=["negative-with-list", "negative-all-visible", "not-an-int"],
)
def test_bad_local_rank_env_var_is_a_config_error(env):
    with pytest.raises(ConfigError, match="LOCAL_RANK|local rank"):
        child_visible_devices(env, None)


def test_a_ray_actors_gpus_are_its_childs_whatever_its_local_rank():
    # Ray hands an actor physical GPU ids (and may leave LOCAL_RANK at anything, or unset)
    env = {"CUDA_VISIBLE_DEVICES": "2", "LOCAL_RANK": "5"}
    assert child_visible_devices(env, None, launcher_gpus=("2",)) == "2"
    # a CPU actor's child sees no GPU
    assert child_visible_devices({}, None, launcher_gpus=()) == ""
    with pytest.raises(
        ConfigError,
        match=r"this Ray worker holds GPUs \['2', '3'\]; one child serves one rank's GPU",
    ):
        child_visible_devices({}, None, launcher_gpus=("2", "3"))
    assert child_visible_devices({}, None, allow_multiple=True, launcher_gpus=("2", "3")) == "2,3"
    # a configured local_rank or visible_devices still wins
    assert (
        child_visible_devices({"CUDA_VISIBLE_DEVICES": "2,3"}, 1, launcher_gpus=("2", "3")) == "3"
    )
    assert child_visible_devices({}, None, "7", launcher_gpus=("2",)) == "7"


# -- the rank a launcher gave this process (supervisor.child.ranks) --------------------------------
def test_rank_from_torchrun_variables():
    from supervisor.child import ranks

    env = {"RANK": "5", "LOCAL_RANK": "1", "WORLD_SIZE": "8", "TORCHELASTIC_RUN_ID": "x"}
    assert ranks.current(env) == ranks.RankInfo("torchrun", 5, 1, 8)
    assert ranks.current({}) == ranks.RankInfo("none", 0, 0, 1)
    with pytest.raises(ConfigError, match="RANK='x' is not an integer"):
        ranks.current({"RANK": "x"})
    with pytest.raises(ConfigError, match="RANK=8 is not below WORLD_SIZE=8"):
        ranks.current({"RANK": "8", "WORLD_SIZE": "8"})
    with pytest.raises(ConfigError, match="LOCAL_RANK='-1' is negative"):
        ranks.current({"LOCAL_RANK": "-1"})


def test_a_spec_made_per_instance_gives_the_parent_no_default():
    """An FF or native model: the class spec is a placeholder (FF's says image), so the parent
    infers no input kind from it; a class spec (jpeg_compressibility) still gives its kind."""
    from scorers.registry import declared_spec

    assert declared_spec("scorers.ff.scorer:FfModelScorer") is None
    assert declared_spec("jpeg_compressibility").input_kind == "image"
    ff = ScorerConfig(
        name="scorers.ff.scorer:FfModelScorer", params={"model": "tests.helpers.term_faults:Hangs"}
    )
    assert ff.input_kind == "text"
    assert ScorerConfig(name="jpeg_compressibility").input_kind == "image"
