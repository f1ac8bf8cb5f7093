"""`engine_model`: a verl-omni named engine model (`backend: engine`) and the reward functions bound
to it, run in one child of the model's env. The child owns the engine process (`process`, through
the keeper) and its residency (`lifecycle`); each function is called once per item with verl-omni's
visual arguments plus `reward_router_address` (the engine's `127.0.0.1:PORT`, no scheme) and
`model_name`, sync or async, exactly as verl's reward loop calls a router-based reward function.

The engine starts in `load()` (a model that cannot be served is a boot failure, with the engine's
log), and sleeps at once when `offload` is set; onload wakes it, offload puts it back to sleep. An
engine that died is an `EngineFailed` (503 `server_fault`): the call fails, naming it, never a
zero.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from scorers.base import ScoreItem, Scorer, ScoreResult, ScorerSpec
from scorers.diagnostics import mean
from scorers.engine.lifecycle import EngineSlot
from scorers.engine.process import EngineFailed, EngineProcess
from scorers.engine.procfs import session_rss_bytes
from scorers.native.loading import NativeSetupError
from scorers.native.runner import FunctionRunner
from scorers.native.scorer import bind_entry, checked_functions

NAME = "engine_model"
ENGINE_HANDLES = ("reward_router_address", "model_name")
DIAGNOSTICS = (
    "engine_start_s",
    "engine_wake_s",
    "engine_sleep_s",
    "engine_rss_bytes",
    "engine_restarts",
)


def _positive(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise NativeSetupError(f"{NAME}: {name} must be a finite number > 0, got {value!r}")
    if value <= 0:
        raise NativeSetupError(f"{NAME}: {name} must be a finite number > 0, got {value!r}")
    return float(value)


class EngineModelScorer(Scorer):
    """One engine-served model and its reward functions; the recipe's keys are its params."""

    spec_per_instance = True
    spec = ScorerSpec(name=NAME, input_kind="image", terms=(NAME,))  # per instance, from params

    def __init__(
        self,
        model_name: str,
        command: list[str],
        functions: list[dict[str, Any]],
        engine_env: Mapping[str, str] | None = None,
        ready_timeout_s: float = 600.0,
        call_timeout_s: float = 600.0,
    ) -> None:
        if (
            not isinstance(command, list)
            or not command
            or not all(isinstance(part, str) for part in command)
        ):
            raise NativeSetupError(f"{NAME}: command must be a non-empty list of strings")
        self.model_name, self.command = str(model_name), command
        self.functions = checked_functions(NAME, functions)
        self.engine_env = {str(k): str(v) for k, v in (engine_env or {}).items()}
        self.ready_timeout_s = _positive("ready_timeout_s", ready_timeout_s)
        self.call_timeout_s = _positive("call_timeout_s", call_timeout_s)
        logged = tuple(
            f"{e['term']}.{key}" for e in self.functions for key in e.get("log_keys", ())
        )
        self.spec = ScorerSpec(
            name=NAME,
            input_kind="image",
            terms=tuple(entry["term"] for entry in self.functions),
            revision="engine-1",
            env="engine",
            supports_offload=True,
            diagnostics=(*DIAGNOSTICS, *logged),
            identity={
                "model_name": self.model_name,
                "command": command,
                "functions": [[e["term"], e.get("path"), e.get("name")] for e in self.functions],
            },
            nonsemantic_params=("engine_env", "ready_timeout_s", "call_timeout_s"),
            requires_modules=("torch",),  # verl-omni hands functions a torch CHW image
        )
        self._slot: EngineSlot | None = None
        self._runner: FunctionRunner | None = None

    def load(self, device: str = "cpu") -> None:
        """Import every function, start the engine and wait until it serves the model, then put it
        to sleep unless the host wakes it right after (`boots_resident`: a resident model's engine
        starts once, not started, stopped and started again), so the host's residency and the
        engine's always agree. Any failure is a boot failure naming the engine's log."""
        bound = [bind_entry(entry, ENGINE_HANDLES) for entry in self.functions]
        engine = EngineProcess(
            self.model_name, self.command, self.engine_env, self.ready_timeout_s, {"device": device}
        )
        self._slot = EngineSlot(engine)
        self._runner = FunctionRunner(f"{NAME} {self.model_name!r}", bound, self.call_timeout_s)
        self._slot.start()
        if not self.boots_resident:
            self._slot.sleep()

    def _live_slot(self) -> EngineSlot:
        if self._slot is None:
            raise RuntimeError(f"{NAME}: used before load()")
        return self._slot

    def onload(self) -> dict[str, Any]:
        if self._runner is not None:
            self._runner.refuse_if_stuck()
        return self._live_slot().wake()

    def offload(self) -> dict[str, Any]:
        return self._live_slot().sleep() if self._slot is not None else {"changed": False}

    def score(self, items: Sequence[ScoreItem]) -> ScoreResult:
        slot, runner = self._live_slot(), self._runner
        if not slot.awake or runner is None:
            raise RuntimeError(f"{NAME}: score() while the engine sleeps (the host wakes it first)")
        slot.serving("scoring")
        handles = {"reward_router_address": slot.engine.address, "model_name": self.model_name}
        result = runner.run(items, handles, handles)
        # an engine that died mid-call fails the call, even where the functions caught its errors
        # and returned a number: never a reward computed without it
        slot.checked(lambda: slot.engine.check_answering("scoring"))
        figures: dict[str, Any] = {
            f"engine_{name}": mean(value, 1) for name, value in slot.last.items()
        }
        figures["engine_rss_bytes"] = mean(session_rss_bytes(slot.engine.pid), 1)
        figures["engine_restarts"], slot.restarts = slot.restarts, 0  # a count: they add up
        result.diagnostics = {**figures, **result.diagnostics}
        return result

    def close(self) -> None:
        """Stop the engine (its whole group) and end the functions' loop and threads."""
        try:
            if self._slot is not None:
                self._slot.engine.close()
        finally:
            if self._runner is not None:
                self._runner.close()
                self._runner = None


__all__ = ["EngineFailed", "EngineModelScorer"]
