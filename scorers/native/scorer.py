"""`native_model`: a verl-omni named native model and the score functions bound to it, run in one
child of the model's env. One request computes every bound term: each function is called once per
item beside the model (`reward_model.infer(...)` is a local call), all of them concurrently on one
event loop. A function's failure is that term's failure alone for that item (`term_failed`): the
item keeps its other terms, and the panel decides, as it knows the term's `required` and where it
applies (required: the step fails naming the term and the item; optional: it adds nothing). Wake
(onload) is a new instance from `__init__`; sleep (offload) is `close()`, the instance dropped,
garbage collected and the accelerator's cache emptied.

A request has one deadline, `call_timeout_s`. A sync function's thread cannot be stopped: past it
the scorer is wedged (`ScorerWedged`), and its child is restarted; it never wakes a second instance
under threads still running in the first.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from scorers.base import ScoreItem, Scorer, ScoreResult, ScorerSpec, ScorerWedged
from scorers.diagnostics import mean
from scorers.native.calls import (
    BlockingHandle,
    ModelHandle,
    ScoreFunction,
    arguments,
    bind,
    solution_image,
    value_of,
)
from scorers.native.lifecycle import ModelSlot
from scorers.native.loading import NativeSetupError, load_attribute, split_reference
from scorers.residency import process_rss_bytes, resolve_device

NAME = "native_model"
SLEEP_DIAGNOSTICS = (
    "slept_instance_alive",
    "slept_param_bytes",
    "slept_param_bytes_alive",
    "rss_bytes",
)
FUNCTION_KEYS = {"term", "path", "name", "kwargs", "log_keys"}


def _functions(functions: Any) -> list[dict[str, Any]]:
    if not isinstance(functions, list) or not functions:
        raise NativeSetupError(f"{NAME}: functions must be a non-empty list of reward functions")
    for entry in functions:
        if (
            not isinstance(entry, Mapping)
            or set(entry) - FUNCTION_KEYS
            or not isinstance(entry.get("term"), str)
        ):
            raise NativeSetupError(
                f"{NAME}: a function is {{term, path, name, kwargs, log_keys}}, got {entry!r}"
            )
    return [dict(entry) for entry in functions]


class NativeModelScorer(Scorer):
    """One native model (`executor.model`) and its reward functions; verl-omni's keys are its
    params."""

    spec_per_instance = True
    # per instance, from the functions
    spec = ScorerSpec(name=NAME, input_kind="image", terms=(NAME,))

    def __init__(
        self,
        model: str,
        functions: list[dict[str, Any]],
        model_path: str | None = None,
        kwargs: Mapping[str, Any] | None = None,
        call_timeout_s: float = 600.0,
    ) -> None:
        split_reference(model, f"{NAME} model")  # the shape only: the class imports in load()
        self.model, self.model_path, self.kwargs = model, model_path, dict(kwargs or {})
        self.functions = _functions(functions)
        if (
            not isinstance(call_timeout_s, (int, float))
            or not math.isfinite(call_timeout_s)
            or call_timeout_s <= 0
        ):
            raise NativeSetupError(
                f"{NAME}: call_timeout_s must be a finite number > 0, got {call_timeout_s!r}"
            )
        self.call_timeout_s = float(call_timeout_s)
        terms = tuple(entry["term"] for entry in self.functions)
        logged = tuple(
            f"{e['term']}.{key}" for e in self.functions for key in e.get("log_keys", ())
        )
        self.spec = ScorerSpec(
            name=NAME,
            input_kind="image",
            terms=terms,
            revision="native-1",
            env="embed",
            supports_offload=True,
            diagnostics=(*SLEEP_DIAGNOSTICS, *logged),
            identity={
                "model": model,
                "functions": [[e["term"], e.get("path"), e.get("name")] for e in self.functions],
            },
            nonsemantic_params=("call_timeout_s",),
            requires_modules=("torch",),
        )
        self._bound: list[ScoreFunction] = []
        self._slot: ModelSlot | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pool: ThreadPoolExecutor | None = None

    def load(self, device: str = "cpu") -> None:
        """Import the model class and every function (a failure is a boot failure); wake nothing."""
        where, attr = split_reference(self.model, f"{NAME} model")
        cls = load_attribute(where, attr, f"model {self.model!r}")
        if not isinstance(cls, type) or not callable(getattr(cls, "infer", None)):
            raise NativeSetupError(f"model {self.model!r} is not a class with an infer() method")
        self._bound = [self._bind(entry) for entry in self.functions]
        device = resolve_device("cuda:0" if device == "cuda" else device)
        kwargs = {"model_path": self.model_path, "device": _torch_device(device), **self.kwargs}
        self._loop = asyncio.new_event_loop()
        self._pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="native-reward")
        self._slot = ModelSlot(cls, kwargs, device, self._loop.run_until_complete)
        # a call that timed out: its sync functions may still run on the model
        self._stuck: str | None = None

    @staticmethod
    def _bind(entry: Mapping[str, Any]) -> ScoreFunction:
        term = entry["term"]
        function = load_attribute(
            str(entry.get("path")), str(entry.get("name")), f"reward function {term!r}"
        )
        log_keys = tuple(entry.get("log_keys", ()))
        return bind(term, function, entry.get("kwargs", {}), log_keys)

    def onload(self) -> dict[str, Any]:
        self._refuse_if_stuck()
        return self._awake_slot().wake()

    def _refuse_if_stuck(self) -> None:
        """Never a second instance under threads still running in the first (a timed-out call's)."""
        if self._stuck is not None:
            raise ScorerWedged(f"this call never started: {self._stuck}", timed_out=False)

    def offload(self) -> dict[str, Any]:
        return self._slot.sleep() if self._slot is not None else {"changed": False}

    def _awake_slot(self) -> ModelSlot:
        if self._slot is None:
            raise RuntimeError(f"{NAME}: used before load()")
        return self._slot

    def score(self, items: Sequence[ScoreItem]) -> ScoreResult:
        self._refuse_if_stuck()
        slot = self._awake_slot()
        if slot.instance is None or self._loop is None or self._pool is None:
            raise RuntimeError(f"{NAME}: score() while the model sleeps (the host wakes it first)")
        diagnostics: dict[str, Any] = {**slot.released(), "rss_bytes": mean(process_rss_bytes(), 1)}
        handles = (
            ModelHandle(slot.instance, self._pool),
            BlockingHandle(slot.instance, self._loop, self.call_timeout_s),
        )
        outcomes = self._loop.run_until_complete(self._all(items, handles))
        del handles  # nothing of the instance outlives the call but the slot's own reference
        terms: dict[str, list[float]] = {fn.term: [0.0] * len(items) for fn in self._bound}
        term_failed: dict[str, dict[int, str]] = {}
        logged: dict[str, list[float]] = {}
        for (fn, index), outcome in zip(self._pairs(items), outcomes, strict=True):
            if isinstance(outcome, BaseException):
                why = (
                    f"reward function {fn.term!r} failed on item {items[index].id!r}: "
                    f"{type(outcome).__name__}: {outcome}"
                )
                term_failed.setdefault(fn.term, {})[index] = why
                continue
            terms[fn.term][index], extra = outcome
            for key, value in extra.items():
                logged.setdefault(f"{fn.term}.{key}", []).append(value)
        diagnostics.update(
            {name: mean(sum(values), len(values)) for name, values in logged.items()}
        )
        return ScoreResult(terms=terms, diagnostics=diagnostics, term_failed=term_failed)

    def _pairs(self, items: Sequence[ScoreItem]) -> list[tuple[ScoreFunction, int]]:
        return [(fn, index) for index in range(len(items)) for fn in self._bound]

    async def _all(
        self, items: Sequence[ScoreItem], handles: tuple[ModelHandle, BlockingHandle]
    ) -> list[Any]:
        """Every (item, function) at once, within one deadline; an outcome is a value or its
        exception."""
        images = [solution_image(item) for item in items]
        calls = [
            self._one(fn, items[index], images[index], handles) for fn, index in self._pairs(items)
        ]
        try:
            return await asyncio.wait_for(
                asyncio.gather(*calls, return_exceptions=True), self.call_timeout_s
            )
        except TimeoutError as exc:
            self._stuck = (
                f"{NAME} {self.model!r}: {len(calls)} reward function calls did not finish within "
                f"call_timeout_s={self.call_timeout_s}; their threads cannot be stopped: "
                f"this process must be restarted"
            )
            raise ScorerWedged(self._stuck, timed_out=True) from exc

    async def _one(
        self,
        fn: ScoreFunction,
        item: ScoreItem,
        image: Any,
        handles: tuple[ModelHandle, BlockingHandle],
    ) -> tuple[float, dict[str, float]]:
        if fn.is_async:
            result = await fn.function(**arguments(fn, item, image, handles[0]))
        else:
            loop = asyncio.get_running_loop()
            result = await loop.run_in_executor(
                self._pool, lambda: fn.function(**arguments(fn, item, image, handles[1]))
            )
        return value_of(fn, result)

    def close(self) -> None:
        """Sleep the model if awake, then end the loop and the worker threads (a stuck one is not
        waited for)."""
        try:
            if self._slot is not None:
                self._slot.sleep()
        finally:
            if self._pool is not None:
                self._pool.shutdown(wait=False, cancel_futures=True)
                self._pool = None
            if self._loop is not None:
                self._loop.close()
                self._loop = None


def _torch_device(device: str) -> Any:
    import torch

    return torch.device(device)
