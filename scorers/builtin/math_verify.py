"""math_verify reward: 1.0 when the answer in the text equals the gold answer.

Grading runs in a GradingPool (forkserver workers that preload math_verify),
because sympy can hang on pathological input (`\\boxed{9^{9^{9^{9}}}}`): an item
past a soft deadline moves out of its slot to a held-back overflow worker, a per-item
timeout SIGKILLs it there, and a memory cap stops one that allocates gigabytes; such
an item scores 0.0, counted in diagnostics (`on_timeout="raise"` fails the batch
instead). The worker that takes the freed slot forks from a template that replays some
of each call's items while the trainer generates, so it starts with warm caches. Worker, IPC and
batch-cap failures raise; the next call then gets a fresh pool. An unparsable gold answer is a
ScoreInputError. load() starts the pool without waiting for it (its forkserver's import and warm-up
are most of a math child's start): the child says ready sooner, and the first call waits for the
workers. Nothing here imports math_verify in the owner process.
"""

from __future__ import annotations

import importlib.util
import logging
import math
import os
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from scorers.base import (
    ScoreInputError,
    ScoreItem,
    Scorer,
    ScoreResult,
    ScorerSpec,
    reference_answer,
)
from scorers.builtin.math_verify_boot import GRADE_FN, PRELOAD
from scorers.grading.config import overflow_options
from scorers.grading.errors import GradingTaskError
from scorers.grading.pool import GradingPool

log = logging.getLogger(__name__)
TIMEOUT_ENV = "MATH_VERIFY_TIMEOUT_S"
DEFAULT_TIMEOUT_S = 10.0
DEFAULT_WARM_REPLAY = 64  # about 0.8 s of one core per call, while the trainer generates
START_WAIT_S = 90.0  # a backstop: the pool bounds its workers' start at 60 s
# chunks graded at once: a request of up to 64 chunks pays one timeout, however chunked
CONCURRENT_CALLS = 64
# outcomes of an item that passed a bound (scored 0 unless on_timeout="raise") -> their diagnostic
BOUNDS = {
    "timeout": "timeouts",
    "memory": "memory_exceeded",
    "cpu": "cpu_exceeded",
    "budget": "memory_budget_exceeded",
}


def _check_int(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"math_verify: {name} must be an int, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"math_verify: {name} must be >= {minimum}, got {value}")
    return value


def _check_megabytes(name: str, value: Any) -> int | None:
    """A memory bound in MiB (at least 16), or None: no bound."""
    return None if value is None else _check_int(name, value, 16)


def _check_strict(strict: Any) -> bool:
    if not isinstance(strict, bool):
        raise TypeError(f"math_verify: strict must be a bool, got {type(strict).__name__}")
    return strict


def _check_on_timeout(on_timeout: Any) -> str:
    if on_timeout not in ("zero", "raise"):
        raise ValueError(f"math_verify: on_timeout must be 'zero' or 'raise', got {on_timeout!r}")
    return on_timeout


def _resolve_timeout(timeout_s: Any) -> float:
    """Explicit param, else $MATH_VERIFY_TIMEOUT_S, else 10 s; must be finite and > 0."""
    source = "timeout_s"
    if timeout_s is None:
        raw = os.environ.get(TIMEOUT_ENV, "").strip()
        if not raw:
            return DEFAULT_TIMEOUT_S
        source = f"${TIMEOUT_ENV}"
        try:
            timeout_s = float(raw)
        except ValueError:
            raise ValueError(f"math_verify: {source}={raw!r} is not a number") from None
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)):
        raise TypeError(f"math_verify: timeout_s must be a number, got {type(timeout_s).__name__}")
    if not (math.isfinite(timeout_s) and timeout_s > 0):
        raise ValueError(f"math_verify: {source} must be finite and > 0, got {timeout_s!r}")
    return float(timeout_s)


class MathGradeTimeout(RuntimeError):
    """Items passed their timeout and the scorer was configured with on_timeout='raise'."""


class MathVerifyScorer(Scorer):
    """Pointwise 0/1 math answer check against `reference` (string or {'answer': ...})."""

    spec = ScorerSpec(
        name="math_verify",
        input_kind="text",
        required_fields=("text", "reference"),
        terms=("math_verify",),
        revision="math-verify-0.9.0",
        env="math",
        report_packages=("math-verify", "antlr4-python3-runtime", "sympy"),
        diagnostics=(
            "timeouts",
            "memory_exceeded",
            "cpu_exceeded",
            "memory_budget_exceeded",
            "overflowed",
        ),
        nonsemantic_params=("jobs", "soft_timeout_s", "overflow", "warm_replay"),
        requires_modules=("math_verify", "sympy"),
        # the chunks of one request share the pool, so their pathological items share one timeout
        concurrent_calls=CONCURRENT_CALLS,
    )

    def __init__(  # noqa: PLR0913 - its params, each a recipe `params:` key (they make its identity)
        self,
        *,
        jobs: int | None = None,
        timeout_s: float | None = None,
        float_rounding: int = 6,
        numeric_precision: int = 15,
        strict: bool = True,
        on_timeout: str = "zero",
        soft_timeout_s: float | None = None,
        overflow: int | None = None,
        memory_cap_mb: int | None = 512,
        warm_replay: int = DEFAULT_WARM_REPLAY,
        memory_budget_mb: int | None = 512,
    ) -> None:
        """`soft_timeout_s` (default min(0.1 s, timeout_s / 2)): an item that has used that much CPU
        time (or held its slot 4x as long) leaves its slot for an overflow worker (at most
        `overflow`, default max(16, 4 x jobs); 0: never), so ordinary items keep flowing.
        `memory_cap_mb`: what one item may map beyond a fresh worker (None: no cap). `warm_replay`:
        workers fork from a template that replays this many of each call's items while the pool is
        idle, so a worker started mid-batch grades as fast as a veteran (0: they fork cold).
        `memory_budget_mb`: the private memory all held items together may keep; past it the largest
        are killed and score 0 (`memory_budget_exceeded`; None: no budget)."""
        super().__init__()
        self.jobs = len(os.sched_getaffinity(0)) if jobs is None else _check_int("jobs", jobs, 1)
        self.timeout_s = _resolve_timeout(timeout_s)
        # checked here, not at load(): a bad soft deadline or bound is the config's fault
        self.soft_timeout_s, self.overflow = overflow_options(
            self.jobs, self.timeout_s, soft_timeout_s, overflow
        )
        self.warm_replay = _check_int("warm_replay", warm_replay, 0)
        self.memory_cap_mb = _check_megabytes("memory_cap_mb", memory_cap_mb)
        self.memory_budget_mb = _check_megabytes("memory_budget_mb", memory_budget_mb)
        self.float_rounding = _check_int("float_rounding", float_rounding, 0)
        self.numeric_precision = _check_int("numeric_precision", numeric_precision, 1)
        self.strict = _check_strict(strict)
        self.on_timeout = _check_on_timeout(on_timeout)
        self.pool_restarts = 0
        self._pool: GradingPool | None = None
        self._pool_lock = threading.Lock()  # concurrent score() calls replace a broken pool once

    def identity_params(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """The timeout as resolved (the param, else $MATH_VERIFY_TIMEOUT_S): it changes verdicts."""
        return {**super().identity_params(params), "timeout_s": self.timeout_s}

    def load(self, device: str = "cpu") -> None:
        """Start the grading workers (CPU only; `device` is ignored), without waiting for them: the
        forkserver's preload and warm-up (most of a math child's start) then overlap the trainer's
        own start, and the first score() waits for them (and raises their start's failure). A
        package the grader imports that is missing fails here, as a boot failure."""
        if self._pool is not None:
            return
        missing = [
            name for name in self.spec.requires_modules if importlib.util.find_spec(name) is None
        ]
        if missing:
            raise ModuleNotFoundError(
                f"math_verify: this Python lacks {', '.join(missing)} (use the math env)"
            )
        pool = GradingPool(
            self.jobs,
            self.timeout_s,
            GRADE_FN,
            preload=list(PRELOAD),
            soft_timeout_s=self.soft_timeout_s,
            overflow=self.overflow,
            memory_cap_bytes=None if self.memory_cap_mb is None else self.memory_cap_mb * 2**20,
            warm_replay=self.warm_replay,
            memory_budget_bytes=None
            if self.memory_budget_mb is None
            else self.memory_budget_mb * 2**20,
        )
        try:
            pool.start(wait=False)
        except BaseException:
            pool.close()
            raise
        self._pool = pool

    def warming(self) -> bool:
        """The grading workers load() started are not up yet."""
        pool = self._pool
        return pool is not None and pool.starting

    def _working_pool(self) -> GradingPool:
        """The pool, replaced first if an earlier call broke it (that call raised; this one gets
        fresh workers)."""
        with self._pool_lock:
            if self._pool is None:
                raise RuntimeError(
                    "MathVerifyScorer.score() called before load() (or after close())"
                )
            if self._pool.broken:
                log.warning(
                    "math_verify: grading pool broke on an earlier call; starting a new one"
                )
                self.close()
                self.load()
                self.pool_restarts += 1
            assert self._pool is not None
            return self._pool

    def score(self, items: Sequence[ScoreItem]) -> ScoreResult:
        """Thread-safe: calls at once share the pool's workers. The workers' start that load() left
        running is waited for first, so that every answer, an input error too, comes from a warm
        child (its parent then holds the next request to its request timeout)."""
        started = self._pool
        if started is not None:
            started.wait_started(START_WAIT_S)
        tasks = [self._task(index, item) for index, item in enumerate(items)]
        pool = self._working_pool()
        try:
            outcomes = pool.grade(tasks)
        except GradingTaskError as exc:
            if exc.remote_type == "UnparsableGoldError":
                item = items[exc.task_index]
                raise ScoreInputError(
                    f"items[{exc.task_index}] (id={item.id!r}): {exc.remote_text.splitlines()[0]}"
                ) from exc
            raise
        bounded = {
            status: [i.id for i, o in zip(items, outcomes, strict=True) if o.status == status]
            for status in BOUNDS
        }
        over = [item_id for ids in bounded.values() for item_id in ids]
        if over and self.on_timeout == "raise":
            raise MathGradeTimeout(
                f"math_verify: {len(over)} items passed their bounds (timeout_s={self.timeout_s}, "
                f"memory_cap_mb={self.memory_cap_mb}): "
                + "; ".join(f"{status}: {ids[:10]}" for status, ids in bounded.items() if ids)
            )
        scores = [float(outcome.value) if outcome.status == "ok" else 0.0 for outcome in outcomes]
        if over:
            log.warning(
                "math_verify: %d items passed their bounds and scored 0: %s", len(over), over[:20]
            )
        return ScoreResult(
            terms={"math_verify": scores},
            diagnostics={
                **{name: len(bounded[status]) for status, name in BOUNDS.items()},
                "overflowed": sum(outcome.overflowed for outcome in outcomes),
            },
        )

    def close(self) -> None:
        """Kill the grading workers (bounded, idempotent)."""
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()

    def _task(self, index: int, item: ScoreItem) -> tuple:
        """The grade_fn args for one item; a missing text or gold is the caller's error."""
        gold = reference_answer(item.reference)
        if gold is None:
            raise ScoreInputError(
                f"items[{index}] (id={item.id!r}): math_verify needs a reference answer"
            )
        if not isinstance(item.text, str):
            raise ScoreInputError(
                f"items[{index}] (id={item.id!r}): math_verify needs text, got "
                f"{type(item.text).__name__}"
            )
        return (item.text, gold, self.float_rounding, self.numeric_precision, self.strict)
