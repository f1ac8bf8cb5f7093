"""One verl-omni score function called on one item, beside its model: the arguments verl-omni's
visual manager passes, the `reward_model` handle, and the float or `{"score": ...}` it returns.

Sync and async both ways: an async function awaits `reward_model.infer(...)`, a sync one (run on a
worker thread) calls it and gets the value; a sync `infer` runs on a worker thread, never on the
event loop, an async one on the loop.
"""

from __future__ import annotations

import asyncio
import inspect
import math
from collections.abc import Callable, Mapping
from concurrent.futures import Executor
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np

from scorers.base import ScoreItem
from scorers.native.loading import NativeSetupError

VISUAL_ARGUMENTS = ("data_source", "solution_image", "ground_truth", "extra_info")


class ScoreFunctionError(RuntimeError):
    """A score function raised, or returned something other than a finite float or `{"score":
    ...}`."""


@dataclass(frozen=True)
class ScoreFunction:
    """A reward term's function, its extra keys (already filtered to what it accepts) and whether
    it is async."""

    term: str
    function: Callable[..., Any]
    extra: Mapping[str, Any] = field(default_factory=dict)
    log_keys: tuple[str, ...] = ()

    @property
    def is_async(self) -> bool:
        return inspect.iscoroutinefunction(self.function)


def bind(
    term: str,
    function: Any,
    extra: Mapping[str, Any],
    log_keys: tuple[str, ...],
    handles: tuple[str, ...],
) -> ScoreFunction:
    """The function with its extra keys filtered to its signature (all of them if it takes
    **kwargs); refused at boot when it cannot take what every call passes (verl-omni's visual
    arguments and `handles`) or needs an argument no call passes, rather than failing every item."""
    if not callable(function):
        raise NativeSetupError(f"reward function {term!r}: {function!r} is not callable")
    parameters = inspect.signature(function).parameters
    passed = (*VISUAL_ARGUMENTS, *handles)
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        extra = {key: value for key, value in extra.items() if key in parameters}
        refused = [name for name in passed if name not in parameters]
        if refused:
            raise NativeSetupError(
                f"reward function {term!r} does not take {refused}: every call passes "
                f"{list(passed)}; add them (or **kwargs) to its signature"
            )
    needed = [
        name
        for name, p in parameters.items()
        if p.default is inspect.Parameter.empty
        and p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
        and name not in passed
        and name not in extra
    ]
    if needed:
        raise NativeSetupError(
            f"reward function {term!r} needs {needed}, which no call passes (it passes "
            f"{list(passed)} and the function's own keys in the recipe)"
        )
    return ScoreFunction(term, function, dict(extra), log_keys)


class ModelHandle:
    """`reward_model` for an async score function: `await reward_model.infer(...)`."""

    def __init__(self, model: Any, pool: Executor) -> None:
        self._infer, self._pool = model.infer, pool

    async def infer(self, *args: Any, **kwargs: Any) -> Any:
        if inspect.iscoroutinefunction(self._infer):
            return await self._infer(*args, **kwargs)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, partial(self._infer, *args, **kwargs))


class BlockingHandle:
    """`reward_model` for a sync score function (on a worker thread): `reward_model.infer(...)`
    returns the value; an async `infer` runs on the scorer's loop, waited for up to `timeout_s`."""

    def __init__(self, model: Any, loop: asyncio.AbstractEventLoop, timeout_s: float) -> None:
        self._infer, self._loop, self._timeout_s = model.infer, loop, timeout_s

    def infer(self, *args: Any, **kwargs: Any) -> Any:
        if inspect.iscoroutinefunction(self._infer):
            future = asyncio.run_coroutine_threadsafe(self._infer(*args, **kwargs), self._loop)
            return future.result(timeout=self._timeout_s)
        return self._infer(*args, **kwargs)


def solution_image(item: ScoreItem) -> Any:
    """The item's HWC uint8 image as verl-omni's uint8 CHW tensor (a private copy: inputs are
    read-only)."""
    import torch

    return torch.from_numpy(np.array(item.required_image().transpose(2, 0, 1), order="C"))


def arguments(
    fn: ScoreFunction, item: ScoreItem, image: Any, handles: Mapping[str, Any]
) -> dict[str, Any]:
    """verl-omni's visual arguments, the function's extra keys, and what its model hands it
    (`reward_model`, or `reward_router_address` and `model_name`): those win over extra keys."""
    base = {
        "data_source": item.data_source,
        "solution_image": image,
        "ground_truth": item.reference,
        "extra_info": dict(item.metadata),
        **handles,
    }
    return {**fn.extra, **base}


def value_of(fn: ScoreFunction, result: Any) -> tuple[float, dict[str, float]]:
    """The score and the declared extra keys it logged; anything else is a ScoreFunctionError."""
    logged: dict[str, float] = {}
    if isinstance(result, Mapping):
        if "score" not in result:
            raise ScoreFunctionError(f"returned a mapping without 'score' (keys {sorted(result)})")
        logged = {key: _number(fn, f"{key!r}", result[key]) for key in fn.log_keys if key in result}
        result = result["score"]
    return _number(fn, "score", result), logged


def _number(fn: ScoreFunction, what: str, value: Any) -> float:
    if hasattr(value, "item") and getattr(value, "ndim", 1) == 0:  # a 0-d tensor or NumPy scalar
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ScoreFunctionError(f"{what} is {value!r}, expected a finite number")
    return float(value)
