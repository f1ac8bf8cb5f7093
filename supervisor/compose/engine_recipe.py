"""verl-omni's named engine models (`reward.models.<name>.backend: engine`) as backend configs.

An engine model is served by an OpenAI-compatible engine process that its scorer child starts from
the model's env (`scorers.engine`): by default vLLM's `vllm serve`, or the `command` given (ours; a
list or a string, with `{model_path}`, `{model_name}`, `{port}`, `{device}`, `{python}`, `{bin}`,
`{tensor_model_parallel_size}`, `{data_parallel_size}`, `{pipeline_model_parallel_size}` filled
in). Its reward functions run in that child and get `reward_router_address` and `model_name`.
`reward.reward_model.model_path` and `reward.reward_model.rollout` are the common defaults a named
model's own keys override. World size as verl-omni states it: one replica is TP x DP x PP GPUs,
`n_gpus_per_node x nnodes` GPUs make `replicas` of them; engines take the first GPU indices, in
configuration order, before any native model's `placement.devices`. `device: cpu` (ours) runs one
engine on CPU.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from typing import Any

from supervisor.compose.model_keys import (
    Bound,
    function_entry,
    function_terms,
    model_env,
    process_keys,
)
from supervisor.config import ReplicasConfig
from supervisor.errors import ConfigError

ENGINE_SCORER = "scorers.engine.scorer:EngineModelScorer"
MODEL_KEYS = {"backend", "model_path", "n_gpus_per_node", "nnodes", "rollout", "offload", "env"}
MODEL_KEYS |= {"python_executable", "extra_import_paths", "process", "restart", "limits"}
MODEL_KEYS |= {"request_batch_size", "call_timeout_s", "ready_timeout_s", "command", "device"}
MODEL_KEYS |= {"engine_env"}
SIZES = ("tensor_model_parallel_size", "data_parallel_size", "pipeline_model_parallel_size")
# rollout keys the default vLLM command passes on, as vLLM's flags
VLLM_FLAGS = {
    "gpu_memory_utilization": "--gpu-memory-utilization",
    "max_model_len": "--max-model-len",
    "dtype": "--dtype",
    "max_num_seqs": "--max-num-seqs",
}
ROLLOUT_KEYS = {"name", *SIZES, *VLLM_FLAGS, "enforce_eager"}
DEFAULT_BATCH = 512
DEFAULT_ENV = "engine"  # transformers serve on CPU; a vLLM env is named with `env:`
SWITCH_S = 120.0  # a sleep or wake request (scorers.engine.lifecycle.CALL_S)
MARGIN_S = 60.0  # beyond the child's own deadlines, for the parent's


def is_engine(model: Any) -> bool:
    return isinstance(model, Mapping) and model.get("backend") == "engine"


def with_defaults(models: Mapping[str, Any], common: Mapping[str, Any]) -> dict[str, Any]:
    """The named models, engine ones with `reward.reward_model`'s defaults under their own keys:
    `model_path`, and the `rollout` keys this recipe reads (a Hydra-resolved verl config carries
    many more common rollout keys, for verl's own engine: not ours to refuse)."""
    rollout = common.get("rollout") or {}
    if not isinstance(rollout, Mapping):
        raise ConfigError("reward.reward_model.rollout must be a mapping")
    inherited = {key: value for key, value in rollout.items() if key in ROLLOUT_KEYS}
    resolved: dict[str, Any] = {}
    for name, model in models.items():
        if is_engine(model):
            own = model.get("rollout") or {}
            if not isinstance(own, Mapping):
                raise ConfigError(f"reward.models.{name}.rollout must be a mapping")
            model = {**model, "rollout": {**inherited, **own}}
            if "model_path" not in model and "model_path" in common:
                model["model_path"] = common["model_path"]
        resolved[name] = model
    return resolved


def engine_backends(models: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """A backend config per engine model (functions filled in later, per panel), in configuration
    order, with the GPU indices each takes first: {name: backend}."""
    backends, first_free = {}, 0
    for name, model in models.items():
        if is_engine(model):
            backends[name], first_free = _engine_backend(name, model, first_free)
    return backends


def engine_allocation(models: Mapping[str, Any]) -> dict[int, str]:
    """The GPU indices the engines take (verl-omni carves them out first): {index: model}."""
    owner, first_free = {}, 0
    for name, model in models.items():
        if is_engine(model) and str(model.get("device", "cuda")).lower() != "cpu":
            size = _world(f"reward.models.{name}", model, model.get("rollout") or {})[0]
            owner.update({index: name for index in range(first_free, first_free + size)})
            first_free += size
    return owner


def engine_terms(
    engines: Mapping[str, dict[str, Any]], functions: Bound, where: str
) -> dict[str, dict[str, Any]]:
    """The panel term of each reward function bound to an engine model, by term name."""
    return function_terms(
        functions, where, "an engine model", lambda m, fns: with_functions(engines[m], fns)
    )


def with_functions(backend: Mapping[str, Any], fns: Bound) -> dict[str, Any]:
    """The engine model's backend with the reward functions bound to it as the scorer's params."""
    scorer = dict(backend["scorer"])
    scorer["params"] = {**scorer["params"], "functions": [function_entry(t, f) for t, f in fns]}
    return {**backend, "scorer": scorer}


def _engine_backend(
    name: str, model: Mapping[str, Any], first_free: int
) -> tuple[dict[str, Any], int]:
    where = f"reward.models.{name}"
    unknown = set(model) - MODEL_KEYS
    if unknown:
        raise ConfigError(f"{where}: unknown keys {sorted(unknown)} for an engine model")
    model_path = model.get("model_path")
    if not isinstance(model_path, str) or not model_path:
        raise ConfigError(
            f"{where}.model_path names the model to serve (or set reward.reward_model.model_path)"
        )
    rollout = model.get("rollout") or {}
    offload = bool(model.get("offload", True))
    device = str(model.get("device", "cuda")).lower()
    sizes = {key: int(rollout.get(key, 1)) for key in SIZES}
    command = _command(where, model, rollout, offload)
    fields = {"model_path": model_path, "model_name": model_path, **sizes}
    ready_timeout_s = float(model.get("ready_timeout_s", 600.0))
    params: dict[str, Any] = {
        "model_name": model_path,  # what vLLM and `transformers serve` list it as
        "command": [_fill(part, fields) for part in command],
        "ready_timeout_s": ready_timeout_s,
        "engine_env": {**_engine_env(command, offload), **dict(model.get("engine_env") or {})},
    }
    if "call_timeout_s" in model:
        params["call_timeout_s"] = model["call_timeout_s"]
    process = process_keys(model)
    call_timeout_s = float(model.get("call_timeout_s", 600.0))
    # the child's own deadlines come first, typed: start + sleep at boot; wake + call + sleep
    process.setdefault("startup_timeout", ready_timeout_s + SWITCH_S + MARGIN_S)
    process.setdefault("request_timeout", ready_timeout_s + call_timeout_s + SWITCH_S + MARGIN_S)
    backend: dict[str, Any] = {
        "kind": "managed",
        "env": model_env(where, model, default=DEFAULT_ENV),
        "process": process,
        "scorer": {"name": ENGINE_SCORER, "input_kind": "image", "params": params},
        "client": {
            "input_kind": "image",
            "request_batch_size": model.get("request_batch_size", DEFAULT_BATCH),
        },
        "gpu_residency": "per_call" if offload else "resident",
    }
    backend.update({key: model[key] for key in ("restart", "limits") if key in model})
    if device == "cpu":
        backend["scorer"]["device"] = "cpu"
        return backend, first_free
    return _on_gpus(where, model, rollout, backend, first_free)


def _on_gpus(
    where: str,
    model: Mapping[str, Any],
    rollout: Mapping[str, Any],
    backend: dict[str, Any],
    first_free: int,
) -> tuple[dict[str, Any], int]:
    """The GPUs of the model's replicas: one child per replica, TP x DP x PP GPUs each."""
    world, unit = _world(where, model, rollout)
    indices = [str(index) for index in range(first_free, first_free + world)]
    backend["scorer"]["device"] = "cuda"
    if unit == 1:
        backend["replicas"] = ReplicasConfig(devices=indices).model_dump()
    elif world == unit:
        backend["process"].update({"visible_devices": ",".join(indices)})
        backend["process"]["allow_multiple_gpus"] = True
    else:
        raise ConfigError(
            f"{where}: {world // unit} replicas of {unit} GPUs each: several multi-GPU replicas "
            f"of one engine model are not supported yet; give one replica (n_gpus_per_node x "
            f"nnodes = {unit}) or TP x DP x PP = 1"
        )
    return backend, first_free + world


def _world(where: str, model: Mapping[str, Any], rollout: Mapping[str, Any]) -> tuple[int, int]:
    """(GPUs the model takes, GPUs per replica) by verl-omni's rule."""
    sizes = [rollout.get(key, 1) for key in SIZES]
    if not all(isinstance(s, int) and not isinstance(s, bool) and s >= 1 for s in sizes):
        raise ConfigError(f"{where}.rollout: {', '.join(SIZES)} are whole numbers >= 1")
    unit = sizes[0] * sizes[1] * sizes[2]
    nodes = model.get("nnodes", 1)
    if nodes != 1:
        raise ConfigError(
            f"{where}.nnodes={nodes}: an engine model runs on the node of the rank that owns it "
            f"(nnodes: 1)"
        )
    world = model.get("n_gpus_per_node", unit)
    if not isinstance(world, int) or world < unit or world % unit:
        raise ConfigError(
            f"{where}: n_gpus_per_node x nnodes = {world} must be a multiple of the replica size "
            f"TP x DP x PP = {unit}"
        )
    return world, unit


def _command(
    where: str, model: Mapping[str, Any], rollout: Mapping[str, Any], offload: bool
) -> list[str]:
    """The given `command` (a list, or a string split like a shell's), or vLLM's serve command."""
    given = model.get("command")
    if isinstance(given, str):
        return shlex.split(given)
    if isinstance(given, list) and given and all(isinstance(part, str) for part in given):
        return list(given)
    if given is not None:
        raise ConfigError(f"{where}.command is a list of strings or one string, got {given!r}")
    unknown = set(rollout) - ROLLOUT_KEYS
    if unknown or rollout.get("name", "vllm") != "vllm":
        raise ConfigError(
            f"{where}.rollout: the default command is vLLM's and takes {sorted(ROLLOUT_KEYS)} "
            f"(name: vllm); for {sorted(unknown) or rollout.get('name')}, give `command:`"
        )
    command = ["{bin}/vllm", "serve", "{model_path}", "--host", "127.0.0.1", "--port", "{port}"]
    command += ["--tensor-parallel-size", "{tensor_model_parallel_size}"]
    command += ["--data-parallel-size", "{data_parallel_size}"]
    command += ["--pipeline-parallel-size", "{pipeline_model_parallel_size}"]
    for key, flag in VLLM_FLAGS.items():
        if key in rollout:
            command += [flag, str(rollout[key])]
    if rollout.get("enforce_eager"):
        command.append("--enforce-eager")
    return command + (["--enable-sleep-mode"] if offload else [])


def _engine_env(command: Sequence[str], offload: bool) -> dict[str, str]:
    """vLLM serves its sleep and wake endpoints only in its dev mode."""
    return {"VLLM_SERVER_DEV_MODE": "1"} if offload and "--enable-sleep-mode" in command else {}


def _fill(part: str, fields: Mapping[str, Any]) -> str:
    """The recipe's placeholders, filled in now; the engine's own (`{port}`, ...) at each start."""
    for key, value in fields.items():
        part = part.replace("{" + key + "}", str(value))
    return part
