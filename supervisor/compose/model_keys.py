"""What verl-omni's native and engine models share: where the model runs (its env and process
keys) and what the child needs of each reward function bound to it."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from supervisor.errors import ConfigError

# a reward function's keys that are the panel term's; `model`, `path`, `name` bind it
TERM_KEYS = {"weight", "required", "applicable_datasets"}
FUNCTION_KEYS = {"model", "path", "name", "log_keys"}


def function_entry(term: str, fn: Mapping[str, Any]) -> dict[str, Any]:
    """What the child needs of one reward function; its extra keys are its kwargs (verl-omni's)."""
    kwargs = {k: v for k, v in fn.items() if k not in TERM_KEYS | FUNCTION_KEYS}
    path = str(fn.get("path", ""))
    entry: dict[str, Any] = {
        "term": term,
        "path": absolute(path),
        "name": fn.get("name"),
        "kwargs": kwargs,
    }
    entry["log_keys"] = list(fn.get("log_keys", ()))  # `required` is the panel term's alone
    return entry


def absolute(reference: str) -> str:
    """A file reference made absolute here (the child may not share the trainer's idea of '.')."""
    if reference.startswith("pkg://"):
        return reference
    where, colon, attr = reference.rpartition(":") if ".py:" in reference else (reference, "", "")
    if where.endswith(".py") or os.sep in where:
        return os.path.abspath(where) + colon + attr
    return reference


def model_env(where: str, model: Mapping[str, Any], default: str | None = None) -> str | None:
    """The scorer env the model runs in: `env:`, else `default`; one of them or
    `python_executable:` must say it."""
    env = model.get("env", None if "python_executable" in model else default)
    if env is None and "python_executable" not in model:
        raise ConfigError(
            f"{where}: say which scorer env the model runs in (`env: NAME`, or "
            f"`python_executable:`)"
        )
    if env is not None and not isinstance(env, str):
        raise ConfigError(f"{where}.env names a scorer env, got {env!r}")
    return env


def process_keys(model: Mapping[str, Any]) -> dict[str, Any]:
    """The child's process config: `process:` and the two keys verl-omni users set beside it."""
    process = dict(model.get("process") or {})
    process.update(
        {key: model[key] for key in ("python_executable", "extra_import_paths") if key in model}
    )
    return process


Bound = Sequence[tuple[str, Mapping[str, Any]]]


def function_terms(
    functions: Bound,
    where: str,
    what: str,
    backend_of: Callable[[str, Bound], dict[str, Any]],
) -> dict[str, dict[str, Any]]:
    """The panel term of each reward function bound to a model, by term name: all the functions of
    one model share one backend config (`backend_of(model, its functions)`: one request per call),
    each its own term of it; `required` defaults to verl-omni's false (an optional term)."""
    bound: dict[str, list[tuple[str, Mapping[str, Any]]]] = {}
    for name, fn in functions:
        bound.setdefault(str(fn.get("model", name)), []).append((name, fn))
    terms = {}
    for model_name, fns in bound.items():
        backend = backend_of(model_name, fns)
        for name, fn in fns:
            if not fn.get("path") or not fn.get("name"):
                raise ConfigError(
                    f"{where}.{name}: {what}'s reward function needs `path` and `name`"
                )
            term = {key: fn[key] for key in TERM_KEYS if key in fn}
            term.setdefault("required", False)
            terms[name] = {"name": name, "backend": backend, "component": name, **term}
    return terms
