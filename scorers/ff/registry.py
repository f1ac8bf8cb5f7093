"""FF's reward-model registry: a short name for a model class, as FF's `register_reward_model`.

Why: FF users name their own classes in `rewards:` by a short name (`reward_model: my_reward`)
once a module registers it. Here the name is resolved in the trainer's process, into the class's
dotted path, which is what the child imports: the child needs no registry, and a model whose env
the trainer cannot import registers by path (`register_reward_model("my_reward",
"my_pkg.rewards:MyReward")`, FF's static lazy entry) instead of by decorator. Names are
case-insensitive, as FF's lookup is. Stdlib only.
"""

from __future__ import annotations

import threading
from typing import Any

from scorers.ff.models import BaseRewardModel, RewardModelConfigError
from scorers.registry import BUILTINS

_REGISTRY: dict[str, str] = {}
_LOCK = threading.Lock()


def register_reward_model(name: str, path: str | None = None) -> Any:
    """`@register_reward_model("my_reward")` on a model class, or `register_reward_model(
    "my_reward", "my_pkg.rewards:MyReward")` for a class not importable here. Registering a name
    again under another class is refused (two classes, one name)."""
    key = _key(name)
    if path is not None:
        _add(key, name, _checked_path(name, path))
        return path

    def decorator(cls: type[BaseRewardModel]) -> type[BaseRewardModel]:
        if not (isinstance(cls, type) and issubclass(cls, BaseRewardModel)):
            raise RewardModelConfigError(
                f"register_reward_model({name!r}): {cls!r} is not a reward model class of "
                "scorers.ff (PointwiseRewardModel or GroupwiseRewardModel)"
            )
        if cls.__module__ == "__main__":
            raise RewardModelConfigError(
                f"register_reward_model({name!r}): {cls.__qualname__} is defined in __main__, "
                "which its child cannot import: define it in a module, or register it by path "
                f"(register_reward_model({name!r}, 'module:{cls.__qualname__}'))"
            )
        _add(key, name, f"{cls.__module__}:{cls.__qualname__}")
        return cls

    return decorator


def reward_model_path(name: str) -> str | None:
    """The dotted path registered under `name` (any case), or None."""
    with _LOCK:
        return _REGISTRY.get(name.lower())


def registered_reward_models() -> dict[str, str]:
    """Every registered name (lowercase) and its class's dotted path."""
    with _LOCK:
        return dict(_REGISTRY)


def unregister_reward_model(name: str) -> None:
    """Forget `name` (a test's, or a notebook's second definition)."""
    with _LOCK:
        _REGISTRY.pop(_key(name), None)


def _key(name: Any) -> str:
    if not isinstance(name, str) or not name or ":" in name or "." in name:
        raise RewardModelConfigError(
            f"a reward model's short name is a non-empty name without '.' or ':' (those make "
            f"a dotted path), got {name!r}"
        )
    if name.lower() in BUILTINS:
        raise RewardModelConfigError(
            f"{name!r} is a scorer of this project's registry: register the model under "
            "another name"
        )
    return name.lower()


def _checked_path(name: str, path: Any) -> str:
    if not isinstance(path, str) or not ("." in path or ":" in path):
        raise RewardModelConfigError(
            f"register_reward_model({name!r}, path): path is a dotted path like "
            f"'my_pkg.rewards:MyReward', got {path!r}"
        )
    return path


def _add(key: str, name: str, path: str) -> None:
    with _LOCK:
        held = _REGISTRY.get(key)
        if held is not None and held != path:
            raise RewardModelConfigError(
                f"reward model name {name!r} is already registered for {held}, not {path}: "
                "one name, one class (unregister_reward_model first to replace it)"
            )
        _REGISTRY[key] = path
