"""TRL: a reward function object for `GRPOTrainer(reward_funcs=[...])`.

TRL calls reward functions with keywords: `prompts`, `completions` (strings, or chat messages
in the conversational format), `completion_ids` (their lengths become `completion_tokens`, for
overlong shaping), and every dataset column (one entry per completion; `data_source` is
passed on for per-dataset weights), plus `log_metric`. It passes no ids and no group ids: ids are
made here; a groupwise scorer gets groups rebuilt from TRL's layout (each prompt's `num_generations`
completions side by side, `num_generations_eval` when evaluating, checked on the whole prompt)
in a single process (a panel with a groupwise term alike), and is refused under several
processes, where a group can span them (never guessed), unless DistributedRewards rebuilds them. TRL
has no cleanup hook: the backend is closed at interpreter exit unless the caller closes it first.
"""

from __future__ import annotations

import asyncio
import atexit
import itertools
import json
import os
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from supervisor.adapters import items as adapter_items
from supervisor.backend import RewardBackend
from supervisor.composition import component, leaf_shapes
from supervisor.errors import ConfigError, ScorerRequestError
from supervisor.types import RewardRequest, RewardResponse

GOLD_COLUMNS = ("answer", "solution", "ground_truth", "reference", "gold")
_CALLS = itertools.count()


def completion_text(completion: Any, where: str = "completion") -> str:
    """A plain completion, or the last message's content in the conversational format; else a
    ScorerRequestError naming `where` (a tool call's message has no text, an empty list no
    message)."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, Sequence) and not completion:
        raise ScorerRequestError(
            f"{where} is an empty list of chat messages: no text to score", kind="bad_input"
        )
    if isinstance(completion, Sequence) and isinstance(completion[-1], dict):
        content = completion[-1].get("content")
        if isinstance(content, str):
            return content
        if isinstance(content, list):  # multimodal parts: the text ones
            return "".join(part.get("text", "") for part in content if isinstance(part, dict))
        calls = " (a tool call)" if completion[-1].get("tool_calls") else ""
        raise ScorerRequestError(
            f"{where}: its last message's content is {type(content).__name__}{calls}, not text",
            kind="bad_input",
        )
    raise ScorerRequestError(
        f"{where} must be a string or a list of chat messages, got {type(completion).__name__}",
        kind="bad_input",
    )


def _trl_extras(columns: dict[str, Any]) -> tuple[Callable[[str, float], None] | None, int | None]:
    """What TRL passes beside the dataset's columns, taken out of them: its metric logger and its
    step."""
    log_metric = columns.pop("log_metric", None)
    step = getattr(columns.pop("trainer_state", None), "global_step", None)
    columns.pop("log_extra", None)
    return log_metric, step


def _training(log_metric: Any) -> bool | None:
    """Whether TRL is training (not evaluating): its `log_metric` is a method of the trainer."""
    model = getattr(getattr(log_metric, "__self__", None), "model", None)
    training = getattr(model, "training", None)
    return training if isinstance(training, bool) else None


class TRLRewardFunction:
    """`reward_funcs=[TRLRewardFunction(backend)]`; `.as_async()` gives TRL's async form."""

    def __init__(
        self,
        backend: RewardBackend,
        reference_column: str | None = None,
        num_generations: int | None = None,
        name: str | None = None,
        close_at_exit: bool = True,
        num_generations_eval: int | None = None,
    ) -> None:
        self.backend = backend
        self.reference_column = reference_column
        shape = component(backend).shape
        # a groupwise scorer anywhere inside (a panel's term too) gets groups rebuilt from TRL's
        # layout
        self.groupwise = any(shape.whole_groups for shape in leaf_shapes(backend))
        if self.groupwise and num_generations is None:
            raise ConfigError("a groupwise scorer needs num_generations (TRL passes no group ids)")
        self.num_generations = num_generations
        # TRL's GRPOConfig.num_generations_eval, if set
        self.num_generations_eval = num_generations_eval
        self.__name__ = name or (shape.name if shape else "reward")
        if close_at_exit:  # idempotent: a backend the caller closed first is left as it is
            atexit.register(backend.close)

    def _request(
        self,
        prompts: Sequence[Any],
        completions: Sequence[Any],
        completion_ids: Any,
        columns: dict[str, Any],
        training: bool | None = None,
        step: int | None = None,
    ) -> RewardRequest:
        call = next(_CALLS)
        column = self.reference_column or next((c for c in GOLD_COLUMNS if c in columns), None)
        if self.reference_column is not None and column not in columns:
            raise KeyError(f"TRL passed no dataset column {column!r} (columns: {sorted(columns)})")
        golds = columns[column] if column is not None else [None] * len(completions)
        groups: list[str | None] = [None] * len(completions)
        offset = self._offset(len(completions))
        size = self._group_size(prompts, training, offset) if self.groupwise else None
        if size is not None:
            groups = [f"trl{call}-g{(offset + i) // size}" for i in range(len(completions))]
        if completion_ids is not None and len(completion_ids) != len(completions):
            raise ValueError(
                f"{len(completion_ids)} completion_ids for {len(completions)} completions"
            )
        sources = columns.get("data_source", [None] * len(completions))
        items = [
            adapter_items.item(
                f"TRL completion {i}",
                id=f"trl{call}-{offset + i}",  # unique over processes: the global position
                group_id=groups[i],
                prompt=prompts[i]
                if isinstance(prompts[i], str)
                else completion_text(prompts[i], f"TRL prompt {i}"),
                text=completion_text(completions[i], f"TRL completion {i}"),
                reference=golds[i],
                data_source=sources[i],
                completion_tokens=len(completion_ids[i]) if completion_ids is not None else None,
            )
            for i in range(len(completions))
        ]
        return adapter_items.request("TRL's reward function", items, size, step)

    def _offset(self, count: int) -> int:
        """Where this process's completions start in TRL's global order (process-major, equal
        slices): under DistributedRewards a group may span processes and is rebuilt whole on one of
        them."""
        rank, ranks = component(self.backend).scoring_world
        if ranks > 1:
            return rank * count
        if self.groupwise and int(os.environ.get("WORLD_SIZE", "1")) > 1:
            raise ConfigError(
                "a groupwise scorer under several TRL processes: a group can span processes "
                "and TRL passes no group ids; wrap the backend in "
                "supervisor.DistributedRewards (it rebuilds such groups)"
            )
        return 0

    def _group_size(self, prompts: Sequence[Any], training: bool | None, offset: int) -> int:
        """The group size of this call from TRL's layout: each prompt's completions side by side, in
        runs of `num_generations` (training) or `num_generations_eval` (evaluation), counted from
        `offset` in the global order and checked on the whole prompt (every message). When both
        sizes fit, the trainer's mode decides; unknown: refused. Alone, a call must hold whole runs;
        a slice of a distributed batch may cut runs at its edges (the ranks check the groups
        together)."""
        assert self.num_generations is not None
        keys = [
            p if isinstance(p, str) else json.dumps(p, sort_keys=True, default=str) for p in prompts
        ]
        sizes = {
            "train": self.num_generations,
            "eval": self.num_generations_eval or self.num_generations,
        }
        alone = component(self.backend).scoring_world[1] == 1

        def fits(size: int) -> bool:
            if alone and len(keys) % size:
                return False
            runs: dict[int, set[str]] = {}
            for i, key in enumerate(keys):
                runs.setdefault((offset + i) // size, set()).add(key)
            return all(len(run) == 1 for run in runs.values())

        fitting = {mode: size for mode, size in sizes.items() if fits(size)}
        if len(set(fitting.values())) == 1:
            return next(iter(fitting.values()))
        if not fitting:
            raise ConfigError(
                f"{len(keys)} completions are not whole runs of one prompt each "
                f"{sorted(set(sizes.values()))} long "
                "(TRL's layout): check num_generations / num_generations_eval"
            )
        if training is None:
            raise ConfigError(
                f"{len(keys)} completions fit groups of {fitting['train']} and of "
                f"{fitting['eval']} (a prompt repeats "
                "across neighbouring groups) and the trainer's mode is unknown: cannot tell which"
            )
        return fitting["train" if training else "eval"]

    def _rewards(
        self, response: RewardResponse, log_metric: Callable[[str, float], None] | None
    ) -> list[float]:
        if log_metric is not None:
            for name, value in response.metrics().items():
                log_metric(name, value)
        return list(response.rewards)

    def __call__(
        self,
        prompts: Sequence[Any],
        completions: Sequence[Any],
        completion_ids: Any = None,
        **columns: Any,
    ) -> list[float]:
        log_metric, step = _trl_extras(columns)
        try:
            request = self._request(
                prompts, completions, completion_ids, columns, _training(log_metric), step
            )
        except Exception as exc:
            self.backend.fail_step(exc, step)  # across ranks, the others raise the same RankFailed
            raise
        return self._rewards(self.backend.compute_rewards(request), log_metric)

    def as_async(self) -> Callable[..., Coroutine[Any, Any, list[float]]]:
        """A coroutine function (TRL awaits those together on its event-loop thread)."""

        async def reward(
            prompts: Sequence[Any],
            completions: Sequence[Any],
            completion_ids: Any = None,
            **columns: Any,
        ) -> list[float]:
            log_metric, step = _trl_extras(columns)
            try:
                request = self._request(
                    prompts, completions, completion_ids, columns, _training(log_metric), step
                )
            except Exception as exc:
                # an exchange: off the event loop
                await asyncio.to_thread(self.backend.fail_step, exc, step)
                raise
            return self._rewards(await self.backend.compute_rewards_async(request), log_metric)

        reward.__name__ = self.__name__
        return reward
