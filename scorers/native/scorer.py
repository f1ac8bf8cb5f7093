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

import math
from collections.abc import Mapping, Sequence
from typing import Any

from scorers.base import ScoreItem, Scorer, ScoreResult, ScorerSpec
from scorers.diagnostics import mean
from scorers.native.calls import BlockingHandle, ModelHandle, ScoreFunction, bind
from scorers.native.lifecycle import ModelSlot
from scorers.native.loading import NativeSetupError, load_attribute, split_reference
from scorers.native.runner import FunctionRunner
from scorers.residency import process_rss_bytes, resolve_device

NAME = "native_model"
SLEEP_DIAGNOSTICS = (
    "slept_instance_alive",
    "slept_param_bytes",
    "slept_param_bytes_alive",
    "rss_bytes",
)
FUNCTION_KEYS = {"term", "path", "name", "kwargs", "log_keys"}


def checked_functions(owner: str, functions: Any) -> list[dict[str, Any]]:
    """The configured reward functions, each {term, path, name, kwargs, log_keys}."""
    if not isinstance(functions, list) or not functions:
        raise NativeSetupError(f"{owner}: functions must be a non-empty list of reward functions")
    for entry in functions:
        if (
            not isinstance(entry, Mapping)
            or set(entry) - FUNCTION_KEYS
            or not isinstance(entry.get("term"), str)
        ):
            raise NativeSetupError(
                f"{owner}: a function is {{term, path, name, kwargs, log_keys}}, got {entry!r}"
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
        self.functions = checked_functions(NAME, functions)
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
        self._slot: ModelSlot | None = None
        self._runner: FunctionRunner | None = None

    def load(self, device: str = "cpu") -> None:
        """Import the model class and every function (a failure is a boot failure); wake nothing."""
        where, attr = split_reference(self.model, f"{NAME} model")
        cls = load_attribute(where, attr, f"model {self.model!r}")
        if not isinstance(cls, type) or not callable(getattr(cls, "infer", None)):
            raise NativeSetupError(f"model {self.model!r} is not a class with an infer() method")
        bound = [bind_entry(entry, ("reward_model",)) for entry in self.functions]
        device = resolve_device("cuda:0" if device == "cuda" else device)
        kwargs = {"model_path": self.model_path, "device": _torch_device(device), **self.kwargs}
        self._runner = FunctionRunner(f"{NAME} {self.model!r}", bound, self.call_timeout_s)
        self._slot = ModelSlot(cls, kwargs, device, self._runner.loop.run_until_complete)

    def onload(self) -> dict[str, Any]:
        if self._runner is not None:
            self._runner.refuse_if_stuck()
        return self._awake_slot().wake()

    def offload(self) -> dict[str, Any]:
        return self._slot.sleep() if self._slot is not None else {"changed": False}

    def _awake_slot(self) -> ModelSlot:
        if self._slot is None:
            raise RuntimeError(f"{NAME}: used before load()")
        return self._slot

    def score(self, items: Sequence[ScoreItem]) -> ScoreResult:
        slot, runner = self._awake_slot(), self._runner
        if slot.instance is None or runner is None:
            raise RuntimeError(f"{NAME}: score() while the model sleeps (the host wakes it first)")
        runner.refuse_if_stuck()
        diagnostics: dict[str, Any] = {**slot.released(), "rss_bytes": mean(process_rss_bytes(), 1)}
        async_handle = {"reward_model": ModelHandle(slot.instance, runner.pool)}
        sync_handle = {
            "reward_model": BlockingHandle(slot.instance, runner.loop, self.call_timeout_s)
        }
        result = runner.run(items, async_handle, sync_handle)
        del async_handle, sync_handle  # nothing of the instance outlives the call but the slot's
        result.diagnostics = {**diagnostics, **result.diagnostics}
        return result

    def close(self) -> None:
        """Sleep the model if awake, then end the loop and the worker threads (a stuck one is not
        waited for)."""
        try:
            if self._slot is not None:
                self._slot.sleep()
        finally:
            if self._runner is not None:
                self._runner.close()
                self._runner = None


def bind_entry(entry: Mapping[str, Any], handles: tuple[str, ...]) -> ScoreFunction:
    """One configured reward function, imported and bound to take verl-omni's visual arguments
    and `handles` (a failure is a boot failure)."""
    term = entry["term"]
    function = load_attribute(
        str(entry.get("path")), str(entry.get("name")), f"reward function {term!r}"
    )
    log_keys = tuple(entry.get("log_keys", ()))
    return bind(term, function, entry.get("kwargs", {}), log_keys, handles)


def _torch_device(device: str) -> Any:
    import torch

    return torch.device(device)
