"""verl-omni's named native models (`reward.models.<name>.backend: native`) as backend configs.

A native model is one deployment: `executor.model` (`module:Class`, `pkg://module:Class` or
`file.py:Class`), `executor.kwargs`, `model_path`, `placement.devices` (one full replica per entry:
a GPU index among the rank's visible devices, or `cpu`, our extension), `offload` (true, the
default as in verl-omni: woken before each call and slept after it; false: resident). Each runs
in managed children of the scorer env its `env:` names, and the reward functions bound to it run
in those children beside it (`scorers.native.scorer`): one backend per model, one term each.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from supervisor.compose.engine_recipe import engine_allocation
from supervisor.compose.model_keys import (
    absolute,
    function_entry,
    function_terms,
    model_env,
    process_keys,
)
from supervisor.errors import ConfigError

NATIVE_SCORER = "scorers.native.scorer:NativeModelScorer"
MODEL_KEYS = {
    "backend",
    "model_path",
    "placement",
    "executor",
    "offload",
    "env",
    "python_executable",
}
MODEL_KEYS |= {
    "extra_import_paths",
    "request_batch_size",
    "process",
    "restart",
    "limits",
    "call_timeout_s",
}
DEFAULT_ENV = "embed"  # torch and transformers: what a native model without `env:` runs in
DEFAULT_BATCH = 512  # one wake and one sleep per request of up to this many items (a chunk each)


def is_native(model: Any) -> bool:
    return isinstance(model, Mapping) and model.get("backend") == "native"


def native_terms(
    models: Mapping[str, Any], functions: Sequence[tuple[str, Mapping[str, Any]]], where: str
) -> dict[str, dict[str, Any]]:
    """The panel term of each reward function bound to a native model, by term name: all the
    functions of one model share one backend config (so one backend, one request per call)."""
    check_devices(models)
    return function_terms(
        functions, where, "a native model", lambda m, fns: native_backend(m, models[m], fns)
    )


def native_backend(
    name: str, model: Mapping[str, Any], fns: Sequence[tuple[str, Mapping[str, Any]]]
) -> dict[str, Any]:
    """One managed backend config: the native scorer with the model and its functions as params."""
    where = f"reward.models.{name}"
    unknown = set(model) - MODEL_KEYS
    if unknown:
        raise ConfigError(f"{where}: unknown keys {sorted(unknown)} for a native model")
    executor = model.get("executor")
    if not isinstance(executor, Mapping) or not isinstance(executor.get("model"), str):
        raise ConfigError(
            f"{where}.executor.model names the model class ('module:Class', 'pkg://...', "
            f"'file.py:Class')"
        )
    device, replicas = placement(where, model.get("placement"))
    params: dict[str, Any] = {
        "model": absolute(executor["model"]),
        "model_path": model.get("model_path"),
        "kwargs": dict(executor.get("kwargs") or {}),
        "functions": [function_entry(term, fn) for term, fn in fns],
    }
    if "call_timeout_s" in model:
        params["call_timeout_s"] = model["call_timeout_s"]
    backend: dict[str, Any] = {
        "kind": "managed",
        "env": model_env(where, model, default=DEFAULT_ENV),
        "process": process_keys(model),
        "scorer": {
            "name": NATIVE_SCORER,
            "input_kind": "image",
            "device": device,
            "params": params,
        },
        "client": {
            "input_kind": "image",
            "request_batch_size": model.get("request_batch_size", DEFAULT_BATCH),
        },
        "gpu_residency": "per_call" if model.get("offload", True) else "resident",
        "replicas": replicas,
    }
    backend.update({key: model[key] for key in ("restart", "limits") if key in model})
    return backend


def placement(where: str, given: Any) -> tuple[str, dict[str, Any]]:
    """`placement.devices` -> the child's device and the replicas: all GPU indices (one child
    narrowed to each) or all `cpu` (that many CPU children)."""
    devices = given.get("devices") if isinstance(given, Mapping) else None
    if not isinstance(devices, list) or not devices:
        raise ConfigError(
            f"{where}.placement.devices lists one entry per replica: GPU indices or cpu"
        )
    cpu = [str(d).lower() == "cpu" for d in devices]
    if all(cpu):
        return "cpu", {"count": len(devices)}
    if any(cpu) or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in devices
    ):
        raise ConfigError(
            f"{where}.placement.devices {devices}: all GPU indices (0, 1, ...) or all cpu, "
            f"not a mix"
        )
    return "cuda", {"devices": [str(d) for d in devices]}


def check_devices(models: Mapping[str, Any]) -> None:
    """No GPU index is listed by two native models, nor taken by an engine model (verl-omni's rule:
    a device is one deployment's, and engines are carved out first)."""
    owner: dict[int, str] = engine_allocation(models)
    for name, model in models.items():
        given = model.get("placement") if is_native(model) else None
        for device in given.get("devices", []) if isinstance(given, Mapping) else []:
            if isinstance(device, int) and not isinstance(device, bool):
                if device in owner:
                    raise ConfigError(
                        f"reward.models.{name}: device {device} is also {owner[device]}'s"
                    )
                owner[device] = name


def check_pool(models: Mapping[str, Any], common: Mapping[str, Any]) -> None:
    """With a dedicated reward pool (`reward.reward_model.enable_resource_pool`), every GPU the
    named models take lies inside it (`n_gpus_per_node x nnodes` of `reward.reward_model`)."""
    if not common.get("enable_resource_pool") or "n_gpus_per_node" not in common:
        return
    pool = int(common["n_gpus_per_node"]) * int(common.get("nnodes", 1))
    used = set(engine_allocation(models))
    for model in models.values():
        given = model.get("placement") if is_native(model) else None
        devices = given.get("devices", []) if isinstance(given, Mapping) else []
        used |= {d for d in devices if isinstance(d, int) and not isinstance(d, bool)}
    if used and max(used) >= pool:
        raise ConfigError(
            f"reward.models: GPUs {sorted(used)} do not fit in the reward pool of {pool} GPUs "
            f"(reward.reward_model.n_gpus_per_node x nnodes)"
        )
