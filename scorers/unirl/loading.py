"""Finding a UniRL local scorer and its Spec by dotted path or registry short name, importing only
that scorer's module.

UniRL 0.2.0's `unirl.reward.local/__init__.py` imports every scorer eagerly (clip, pickscore and the
video ones need torchvision), so importing any one scorer module through it needs every scorer's
pins. Where that import fails for a pin the env lacks, the package is registered bare (its path,
not its `__init__`): `unirl.reward.local.mc_exact_match` then runs only its own imports (and
`.base`'s). Where every pin is there, UniRL's package is imported as UniRL imports it. Runs
where UniRL is installed (the scorer's child; the trainer, to read the input kind); any failure is a
`UniRLScorerError` naming what to fix.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import sys
import threading
import types
from collections.abc import Mapping
from typing import Any, get_type_hints

LOCAL_PACKAGE = "unirl.reward.local"
_BARE_LOCK = threading.Lock()


class UniRLScorerError(ValueError):
    """A UniRL scorer `_target_`, its Spec or its config cannot be found, imported or built."""


def bare_local_package() -> None:
    """`unirl.reward.local` imported as UniRL does where its eager `__init__` imports here, else
    registered without running it (once)."""
    with _BARE_LOCK:
        if LOCAL_PACKAGE in sys.modules:
            return
        try:
            importlib.import_module(LOCAL_PACKAGE)
            return
        except ImportError as exc:  # a pin this env lacks (below), or UniRL missing
            if exc.name is not None and exc.name.split(".")[0] == "unirl":
                raise UniRLScorerError(
                    f"UniRL is not importable by {sys.executable} ({exc}): run the scorer from an "
                    "env that has UniRL and the scorer's pins (python_executable)"
                ) from exc
            # a sibling scorer's pin (torchvision) this env lacks: the package goes in bare, below
        except Exception:  # noqa: BLE001 - a sibling's broken pin (a CUDA torchvision on a CPU torch
            pass  # raises RuntimeError): the named scorer's own import says whether it matters
        try:
            spec = importlib.util.find_spec(LOCAL_PACKAGE)
        except ModuleNotFoundError as exc:
            raise UniRLScorerError(
                f"UniRL is not importable by {sys.executable} ({exc}): run the scorer from an env "
                "that has UniRL and the scorer's pins (python_executable)"
            ) from exc
        if spec is None or spec.submodule_search_locations is None:
            raise UniRLScorerError(f"{LOCAL_PACKAGE} is not a package here: is this UniRL 0.2.0?")
        package = types.ModuleType(LOCAL_PACKAGE, "UniRL's local scorers (registered bare)")
        package.__path__ = list(spec.submodule_search_locations)
        package.__spec__ = spec
        package.__package__ = LOCAL_PACKAGE
        sys.modules[LOCAL_PACKAGE] = package


def registry_paths(name: str) -> tuple[str, str]:
    """A short name of UniRL's local registry -> (scorer path, Spec path), dotted."""
    bare_local_package()
    registry = importlib.import_module(f"{LOCAL_PACKAGE}.registry")
    try:
        scorer = registry.resolve_builtin_reward_scorer_path(name)
    except ValueError as exc:
        raise UniRLScorerError(f"UniRL scorer {name!r}: {exc}") from exc
    # the Spec's place without importing its module (resolve_builtin_reward_spec_class would)
    module, attr = registry._resolve_builtin_spec_entry(name)
    return scorer, f"{module}.{attr}"


def import_path(path: str, what: str) -> Any:
    """The object at `module.Name` (or `module:Name`), the UniRL package registered bare first."""
    module_name, _, attr = path.partition(":") if ":" in path else path.rpartition(".")
    if not module_name or not attr:
        raise UniRLScorerError(f"{what} {path!r} is not a dotted path like 'pkg.module.Class'")
    bare_local_package()
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise UniRLScorerError(f"{what} {path!r}: cannot import {module_name!r}: {exc}") from exc
    if not hasattr(module, attr):
        raise UniRLScorerError(f"{what} {path!r}: module {module_name!r} has no {attr!r}")
    return getattr(module, attr)


def scorer_class(target: str) -> type:
    """The UniRL RewardBackend subclass at `target` (a dotted path or a registry short name)."""
    path = target if "." in target or ":" in target else registry_paths(target)[0]
    cls = import_path(path, "UniRL scorer _target_")
    from unirl.reward.base import RewardBackend

    if not (isinstance(cls, type) and issubclass(cls, RewardBackend)):
        raise UniRLScorerError(
            f"UniRL scorer _target_ {target!r} is not a subclass of "
            "unirl.reward.base.RewardBackend (UniRL's local scorers derive from LocalRewardBackend)"
        )
    return cls


def spec_class(target: str, cls: Any, spec: str | None) -> type:
    """The Spec dataclass: `spec` (the config's `_target_`), else the registry's for a short name,
    else the annotation of the scorer's `config` argument."""
    if spec is None and "." not in target and ":" not in target:
        spec = registry_paths(target)[1]
    if spec is not None:
        found = import_path(spec, "UniRL scorer config _target_")
    else:
        try:
            found = get_type_hints(cls.__init__).get("config")
        except NameError as exc:
            raise UniRLScorerError(
                f"UniRL scorer {target!r}: its `config` annotation does not resolve ({exc}); "
                "give the Spec's dotted path as the config's _target_"
            ) from exc
    if not (isinstance(found, type) and dataclasses.is_dataclass(found)):
        raise UniRLScorerError(
            f"UniRL scorer {target!r}: its Spec {found!r} is not a dataclass; give the Spec's "
            "dotted path as the config's _target_"
        )
    return found


def built_spec(target: str, spec_cls: type, fields: Mapping[str, Any]) -> Any:
    """The Spec built from the recipe's config fields (its own checks run: `__post_init__`)."""
    known = {f.name for f in dataclasses.fields(spec_cls)}
    unknown = sorted(set(fields) - known)
    if unknown:
        raise UniRLScorerError(
            f"UniRL scorer {target!r}: {spec_cls.__name__} has no field(s) {unknown} "
            f"(its fields: {sorted(known)})"
        )
    try:
        return spec_cls(**fields)
    except (TypeError, ValueError) as exc:
        raise UniRLScorerError(f"UniRL scorer {target!r}: {spec_cls.__name__}: {exc}") from exc


def scorer_for_spec(spec: str) -> str:
    """The registry scorer whose Spec is at `spec` (a recipe that names only its config's
    `_target_`)."""
    bare_local_package()
    registry = importlib.import_module(f"{LOCAL_PACKAGE}.registry")
    for name in registry.available_builtin_reward_models():
        scorer, spec_path = registry_paths(name)
        if spec_path == spec:
            return str(scorer)
    raise UniRLScorerError(
        f"no UniRL registry scorer has the Spec {spec!r}: name the scorer's dotted path (scorer=)"
    )
