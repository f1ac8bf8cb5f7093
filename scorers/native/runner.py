"""verl-omni's reward functions run on a batch: each (item, function) once, all concurrently on one
event loop, within one deadline; shared by the native and the engine model scorers, which differ
only in what the functions are handed beside the sample (`reward_model`, or
`reward_router_address` and `model_name`).

A function's failure is that term's failure alone for that item (`term_failed`): the item keeps its
other terms, and the panel decides, as it knows the term's `required` and where it applies. A sync
function's thread cannot be stopped: past the deadline the runner is stuck (`ScorerWedged`) and says
so on every later call, so its process is restarted.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from scorers.base import ScoreItem, ScoreResult, ScorerWedged
from scorers.diagnostics import mean
from scorers.native.calls import ScoreFunction, arguments, solution_image, value_of


class FunctionRunner:
    """The bound functions of one model, its loop and its worker threads."""

    def __init__(self, owner: str, bound: Sequence[ScoreFunction], timeout_s: float) -> None:
        self.owner, self.bound, self.timeout_s = owner, list(bound), timeout_s
        self.loop = asyncio.new_event_loop()
        self.pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="reward-function")
        self.stuck: str | None = None  # a call that timed out: its sync functions may still run

    def refuse_if_stuck(self) -> None:
        """Never a new call (or a second model instance) under threads still running."""
        if self.stuck is not None:
            raise ScorerWedged(f"this call never started: {self.stuck}", timed_out=False)

    def run(
        self,
        items: Sequence[ScoreItem],
        async_handles: Mapping[str, Any],
        sync_handles: Mapping[str, Any],
    ) -> ScoreResult:
        """Every term for every item; the handles are the functions' extra arguments (an async
        function gets `async_handles`, a sync one, on a worker thread, `sync_handles`)."""
        self.refuse_if_stuck()
        outcomes = self.loop.run_until_complete(self._all(items, async_handles, sync_handles))
        terms: dict[str, list[float]] = {fn.term: [0.0] * len(items) for fn in self.bound}
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
        diagnostics = {name: mean(sum(values), len(values)) for name, values in logged.items()}
        return ScoreResult(terms=terms, diagnostics=diagnostics, term_failed=term_failed)

    def _pairs(self, items: Sequence[ScoreItem]) -> list[tuple[ScoreFunction, int]]:
        return [(fn, index) for index in range(len(items)) for fn in self.bound]

    async def _all(
        self,
        items: Sequence[ScoreItem],
        async_handles: Mapping[str, Any],
        sync_handles: Mapping[str, Any],
    ) -> list[Any]:
        """Every (item, function) at once; an outcome is a value or its exception."""
        images = [solution_image(item) for item in items]
        calls = [
            self._one(fn, items[index], images[index], async_handles, sync_handles)
            for fn, index in self._pairs(items)
        ]
        try:
            return await asyncio.wait_for(
                asyncio.gather(*calls, return_exceptions=True), self.timeout_s
            )
        except TimeoutError as exc:
            self.stuck = (
                f"{self.owner}: {len(calls)} reward function calls did not finish within "
                f"call_timeout_s={self.timeout_s}; their threads cannot be stopped: "
                f"this process must be restarted"
            )
            raise ScorerWedged(self.stuck, timed_out=True) from exc

    async def _one(
        self,
        fn: ScoreFunction,
        item: ScoreItem,
        image: Any,
        async_handles: Mapping[str, Any],
        sync_handles: Mapping[str, Any],
    ) -> tuple[float, dict[str, float]]:
        if fn.is_async:
            result = await fn.function(**arguments(fn, item, image, async_handles))
        else:
            result = await self.loop.run_in_executor(
                self.pool, lambda: fn.function(**arguments(fn, item, image, sync_handles))
            )
        return value_of(fn, result)

    def close(self) -> None:
        """End the worker threads (a stuck one is not waited for) and the loop; idempotent."""
        self.pool.shutdown(wait=False, cancel_futures=True)
        if not self.loop.is_closed():
            self.loop.close()
