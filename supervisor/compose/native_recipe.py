"""verl-omni's named native models (`reward.models.<name>.backend: native`) as backend configs.

A native model is one deployment: `executor.model` (`module:Class`, `pkg://module:Class` or
`file.py:Class`), `executor.kwargs`, `model_path`, `placement.devices` (one full replica per entry:
a GPU index among the rank's visible devices, or `cpu`, our extension), `offload` (true, the
default as in verl-omni: woken before each call and slept after it; false: resident). Each runs
in managed children of the scorer env its `env:` names, and the reward functions bound to it run
in those children beside it (`scorers.native.scorer`): one backend per model, one term each.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

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
# the panel's; `model`, `path`, `name` bind
TERM_KEYS = {"weight", "required", "applicable_datasets"}
FUNCTION_KEYS = {"model", "path", "name", "log_keys"}
DEFAULT_BATCH = 512  # one wake and one sleep per request of up to this many items (a chunk each)


def is_native(model: Any) -> bool:
    return isinstance(model, Mapping) and model.get("backend") == "native"


def native_terms(
    models: Mapping[str, Any], functions: Sequence[tuple[str, Mapping[str, Any]]], where: str
) -> dict[str, dict[str, Any]]:
    """The panel term of each reward function bound to a native model, by term name: all the
    functions of one model share one backend config (so one backend, one request per call)."""
    bound: dict[str, list[tuple[str, Mapping[str, Any]]]] = {}
    for name, fn in functions:
        bound.setdefault(str(fn.get("model", name)), []).append((name, fn))
    check_devices(models)
    terms = {}
    for model_name, fns in bound.items():
        backend = native_backend(model_name, models[model_name], fns)
        for name, fn in fns:
            if not fn.get("path") or not fn.get("name"):
                raise ConfigError(
                    f"{where}.{name}: a native model's reward function needs `path` and `name`"
                )
            term = {key: fn[key] for key in TERM_KEYS if key in fn}
            term.setdefault("required", False)  # verl-omni's default: an optional term
            terms[name] = {"name": name, "backend": backend, "component": name, **term}
    return terms


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
        "model": _absolute(executor["model"]),
        "model_path": model.get("model_path"),
        "kwargs": dict(executor.get("kwargs") or {}),
        "functions": [_function(term, fn) for term, fn in fns],
    }
    if "call_timeout_s" in model:
        params["call_timeout_s"] = model["call_timeout_s"]
    backend: dict[str, Any] = {
        "kind": "managed",
        "env": _env(where, model),
        "process": _process(model),
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


def _function(term: str, fn: Mapping[str, Any]) -> dict[str, Any]:
    """What the child needs of one reward function; its extra keys are its kwargs (verl-omni's)."""
    kwargs = {k: v for k, v in fn.items() if k not in TERM_KEYS | FUNCTION_KEYS}
    path = str(fn.get("path", ""))
    entry: dict[str, Any] = {
        "term": term,
        "path": _absolute(path),
        "name": fn.get("name"),
        "kwargs": kwargs,
    }
    entry["log_keys"] = list(fn.get("log_keys", ()))  # `required` is the panel term's alone
    return entry


def _absolute(reference: str) -> str:
    """A file reference made absolute here (the child may not share the trainer's idea of '.')."""
    if reference.startswith("pkg://"):
        return reference
    where, colon, attr = reference.rpartition(":") if ".py:" in reference else (reference, "", "")
    if where.endswith(".py") or os.sep in where:
        return os.path.abspath(where) + colon + attr
    return reference


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
    """No GPU index is listed by two native models (verl-omni's rule: a device is one
    deployment's)."""
    owner: dict[int, str] = {}
    for name, model in models.items():
        given = model.get("placement") if is_native(model) else None
        for device in given.get("devices", []) if isinstance(given, Mapping) else []:
            if isinstance(device, int) and not isinstance(device, bool):
                if device in owner:
                    raise ConfigError(
                        f"reward.models.{name}: device {device} is also {owner[device]}'s"
                    )
                owner[device] = name


def _env(where: str, model: Mapping[str, Any]) -> str | None:
    env = model.get("env")
    if env is None and "python_executable" not in model:
        raise ConfigError(
            f"{where}: say which scorer env the model runs in (`env: NAME`, or "
            f"`python_executable:`)"
        )
    if env is not None and not isinstance(env, str):
        raise ConfigError(f"{where}.env names a scorer env, got {env!r}")
    return env


def _process(model: Mapping[str, Any]) -> dict[str, Any]:
    process = dict(model.get("process") or {})
    process.update(
        {key: model[key] for key in ("python_executable", "extra_import_paths") if key in model}
    )
    return process
