"""`ff_model`: an FF-style reward model class (by dotted path) run as this project's Scorer.

Pointwise models get chunks of at most `batch_size` items (the tail, and items a panel's
applicability left out, make them smaller); groupwise ones one complete group per call, through
the groupwise Scorer contract. `async_reward` with `num_workers` runs a request's chunks on that
many threads and lets the parent send that many requests at once (`concurrent_calls`), as FF's
async workers do; a model whose `thread_safe` is False refuses more than one worker.

A request on the workers has one deadline, `call_timeout_s`. A thread cannot be stopped: a call
whose chunks still run past it leaves the scorer wedged (`ScorerWedged`: its child is restarted),
and the chunks queued behind them never start (those calls say so: queued, not timed out). A call
whose chunks only queued behind other calls' work, none of them started, times out as queued.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import CancelledError, Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

import numpy as np

from scorers.base import ScoreItem, Scorer, ScoreResult, ScorerSpec, ScorerWedged
from scorers.ff.inputs import MEDIA_FIELDS, TEXT_FIELDS, check_fields, model_inputs
from scorers.ff.models import (
    BaseRewardModel,
    LocalAccelerator,
    RewardArguments,
    RewardModelConfigError,
    RewardModelError,
    RewardModelTimeout,
)
from scorers.groups import GroupContext
from scorers.registry import UnknownScorerError, import_dotted
from scorers.residency import resolve_device

NAME = "ff_model"


def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise RewardModelConfigError(f"{NAME}: {name} must be a positive int, got {value!r}")
    return value


def _model_class(model: str) -> type[BaseRewardModel]:
    """The class at `model`; an import failure is UnknownScorerError (preflight knows it:
    env-only)."""
    if not isinstance(model, str) or not model:
        raise RewardModelConfigError(
            f"{NAME}: model must be a dotted path like 'my_pkg.rewards:MyReward'"
        )
    cls = import_dotted(model, f"reward model {model!r}", UnknownScorerError)
    if not (isinstance(cls, type) and issubclass(cls, BaseRewardModel)):
        raise RewardModelConfigError(
            f"reward model {model!r} is not a PointwiseRewardModel or GroupwiseRewardModel "
            f"of scorers.ff "
            "(port an FF model by importing them from scorers.ff instead of FF's rewards.abc)"
        )
    if cls.__call__ is BaseRewardModel.__call__:
        raise RewardModelConfigError(f"reward model {model!r} does not implement __call__")
    return cls


def _input_kind(fields: Sequence[str]) -> str:
    """The completion a model reads: image, else video, else audio, else text."""
    return next((kind for kind in ("image", "video", "audio") if kind in fields), "text")


class FfModelScorer(Scorer):
    """An FF-style reward model by dotted path; FF's config keys are its params."""

    spec_per_instance = True
    # per instance, from the model class
    spec = ScorerSpec(name=NAME, input_kind="image", terms=(NAME,))

    def __init__(
        self,
        model: str,
        model_path: str | None = None,
        dtype: str = "bfloat16",
        batch_size: int = 16,
        async_reward: bool = False,
        num_workers: int = 1,
        params: Mapping[str, Any] | None = None,
        name: str = "default",
        call_timeout_s: float = 600.0,
    ) -> None:
        self.model_cls = _model_class(model)
        self.model, self.model_path, self.dtype, self.name = model, model_path, dtype, name
        self.batch_size = _positive_int("batch_size", batch_size)
        num_workers = _positive_int("num_workers", num_workers)
        if num_workers > 1 and not getattr(self.model_cls, "thread_safe", True):
            raise RewardModelConfigError(
                f"reward model {model!r} declares thread_safe = False: num_workers must be "
                f"1, got {num_workers}"
            )
        if (
            not isinstance(call_timeout_s, (int, float))
            or not math.isfinite(call_timeout_s)
            or call_timeout_s <= 0
        ):
            raise RewardModelConfigError(
                f"{NAME}: call_timeout_s must be a finite number > 0, got {call_timeout_s!r}"
            )
        self.async_reward, self.num_workers = bool(async_reward), num_workers
        self.workers = num_workers if async_reward else 1
        self.params = dict(params or {})
        self.call_timeout_s = float(call_timeout_s)
        self.fields = check_fields(model, getattr(self.model_cls, "required_fields", ()))
        self.tensors = bool(getattr(self.model_cls, "use_tensor_inputs", False))
        self.spec = self._spec()
        self._instance: BaseRewardModel | None = None
        self._pool: ThreadPoolExecutor | None = None
        # a call's chunks still run past its deadline on the workers
        self._wedged: str | None = None

    def _spec(self) -> ScorerSpec:
        groupwise = bool(getattr(self.model_cls, "groupwise", False))
        return ScorerSpec(
            name=NAME,
            input_kind=_input_kind(self.fields),
            required_fields=tuple(f for f in self.fields if f in TEXT_FIELDS or f in MEDIA_FIELDS),
            terms=(NAME,),
            revision="ff-1",
            identity={
                "model": self.model,
                "groupwise": groupwise,
                "tensors": self.tensors,
                "fields": self.fields,
            },
            groupwise=groupwise,
            ragged_groups=True,  # FF's groups are whatever its sampler made them
            nonsemantic_params=(
                "batch_size",
                "async_reward",
                "num_workers",
                "name",
                "call_timeout_s",
            ),
            requires_modules=(self.model.partition(":")[0].split(".")[0],),
            concurrent_calls=self.workers,
        )

    def load(self, device: str = "cpu") -> None:
        """Build the model as FF does, `cls(config, accelerator)`, on the child's device."""
        config = RewardArguments(
            name=self.name,
            reward_model=self.model,
            model_path=self.model_path,
            dtype=self.dtype,
            device=resolve_device(device),
            batch_size=self.batch_size,
            async_reward=self.async_reward,
            num_workers=self.num_workers,
            extra_kwargs=dict(self.params),
        )
        self._instance = self.model_cls(config, LocalAccelerator(device=config.device))
        # groups overlap across requests (concurrent_calls)
        if self.workers > 1 and not self.spec.groupwise:
            self._pool = ThreadPoolExecutor(
                max_workers=self.workers, thread_name_prefix="ff-reward"
            )

    def score(self, items: Sequence[ScoreItem]) -> ScoreResult:
        self._refuse_if_wedged()
        chunks = [
            items[start : start + self.batch_size]
            for start in range(0, len(items), self.batch_size)
        ]
        if self._pool is None or len(chunks) == 1:
            scores = [value for chunk in chunks for value in self._call(chunk)]
        else:
            scores = self._in_workers(self._pool, chunks)
        return ScoreResult(terms={NAME: scores})

    def score_group(self, candidates: Sequence[ScoreItem], context: GroupContext) -> ScoreResult:
        return ScoreResult(terms={NAME: self._call(candidates)})

    def _refuse_if_wedged(self) -> None:
        if self._wedged is not None:
            raise ScorerWedged(f"this call never started: {self._wedged}", timed_out=False)

    def _in_workers(
        self, pool: ThreadPoolExecutor, chunks: list[Sequence[ScoreItem]]
    ) -> list[float]:
        """The chunks on the worker threads, results in item order, within one deadline for all."""
        deadline = time.monotonic() + self.call_timeout_s
        try:
            futures: list[Future[list[float]]] = [
                pool.submit(self._call, chunk) for chunk in chunks
            ]
        except RuntimeError:  # the pool was shut down meanwhile: another call wedged it
            self._refuse_if_wedged()
            raise
        scores: list[float] = []
        try:
            for future in futures:
                scores.extend(future.result(timeout=max(0.0, deadline - time.monotonic())))
        except FutureTimeout as exc:
            failure = self._past_deadline(pool, futures)
            if failure is not None:
                raise failure from exc
            # all ended at the deadline
            scores = [value for future in futures for value in future.result()]
        except CancelledError as exc:  # another call wedged the workers and cancelled what queued
            queued = sum(future.cancelled() for future in futures)
            why = self._wedged or "the workers were shut down"
            raise ScorerWedged(
                f"{queued} of this call's {len(futures)} chunks never started (queued behind "
                f"another call): {why}",
                timed_out=False,
            ) from exc
        finally:
            for future in futures:
                future.cancel()
        return scores

    def _past_deadline(
        self, pool: ThreadPoolExecutor, futures: list[Future[list[float]]]
    ) -> Exception | None:
        """What a call whose deadline passed raises: wedged when its own chunks still run on the
        workers (the pool is shut down, whatever queued behind them cancelled), timed out while
        queued when none of them started; None when every chunk ended just as the deadline
        passed."""
        # a chunk not yet started cancels; a running one not
        queued = sum(future.cancel() for future in futures)
        running = sum(not future.done() for future in futures)
        where = f"reward model {self.model!r}: of {len(futures)} chunks on {self.workers} workers"
        if running:
            self._wedged = (
                f"{where}, {running} still ran after call_timeout_s={self.call_timeout_s} "
                f"({queued} never started, queued); a thread cannot be stopped: this process "
                f"must be restarted"
            )
            # other calls' queued chunks fail at once, as queued
            pool.shutdown(wait=False, cancel_futures=True)
            return ScorerWedged(self._wedged, timed_out=True)
        if not queued:
            return None
        return RewardModelTimeout(
            f"{where}, {queued} never started within call_timeout_s={self.call_timeout_s}: "
            f"queued behind other "
            "calls on the workers"
        )

    def _call(self, items: Sequence[ScoreItem]) -> list[float]:
        if self._instance is None:
            raise RuntimeError(f"{NAME}: score() before load()")
        output = self._instance(**model_inputs(items, self.fields, self.tensors))
        return checked_rewards(self.model, output, len(items))

    def close(self) -> None:
        if self._pool is not None:
            # bounded: a stuck call is not waited for
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
        instance, self._instance = self._instance, None
        closer = getattr(instance, "close", None)
        if callable(closer):
            closer()


def checked_rewards(model: str, output: Any, count: int) -> list[float]:
    """One finite float per input, in order, from a RewardModelOutput; anything else is refused."""
    if not hasattr(output, "rewards"):
        raise RewardModelError(
            f"reward model {model!r} returned {type(output).__name__}, expected "
            f"RewardModelOutput(rewards=...)"
        )
    rewards = output.rewards
    if hasattr(rewards, "detach"):  # a tensor, bfloat16 included
        rewards = rewards.detach().float().cpu().numpy()
    try:
        values = np.asarray(rewards, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise RewardModelError(f"reward model {model!r}: rewards are not numbers ({exc})") from exc
    if values.ndim != 1 or values.shape[0] != count:
        raise RewardModelError(
            f"reward model {model!r}: rewards of shape {list(values.shape)} for {count} inputs "
            "(one score per input, in order)"
        )
    bad = np.flatnonzero(~np.isfinite(values))
    if bad.size:
        raise RewardModelError(
            f"reward model {model!r}: non-finite reward {float(values[bad[0]])!r} for input "
            f"{int(bad[0])} of {count} "
            "(applicability is the panel's: never return NaN for 'not applicable')"
        )
    return [float(value) for value in values]
