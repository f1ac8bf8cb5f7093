"""RewardService: the trainer's single entry point; a bad reward stops the step.

It also owns the truncation policy for variable-length text: a completion is truncated
only when its engine said `finish_reason == "length"`, nothing else.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

from supervisor.backend import RewardBackend
from supervisor.errors import ConfigError, RewardContractError
from supervisor.types import RewardItem, RewardRequest, RewardResponse, first_non_finite

TruncationPolicy = Literal["zero", "keep", "soft"]


class PrecomputedRewardError(ValueError):
    """An item already carries a reward; the service is the only writer."""


class MissingTokenCountError(ValueError):
    """The soft overlong penalty needs every completion's token count."""


class RewardService:
    """Scores items through one backend (or panel) and attaches the rewards.

    `truncation`:
    - `zero` (default): a truncated completion scores 0 (its terms still show what the
      scorer said);
    - `keep`: the reward stands;
    - `soft` (DAPO's overlong penalty): with `L = max_response_length` and
      `B = overlong_buffer_len`, a completion of `n` tokens gets
      `-overlong_penalty_factor * clip((n - (L - B)) / B, 0, 1)` added: nothing up to
      `L - B`, rising linearly to the full factor at `L` (where the engine cuts it).
      Needs `completion_tokens` on every item and refuses one without it.
    """

    def __init__(
        self,
        backend: RewardBackend,
        truncation: TruncationPolicy = "zero",
        max_response_length: int | None = None,
        overlong_buffer_len: int | None = None,
        overlong_penalty_factor: float = 1.0,
    ) -> None:
        if truncation not in ("zero", "keep", "soft"):
            raise ConfigError(f"truncation must be 'zero', 'keep' or 'soft', got {truncation!r}")
        if truncation == "soft":
            if (
                not max_response_length
                or not overlong_buffer_len
                or not 0 < overlong_buffer_len <= max_response_length
            ):
                raise ConfigError(
                    "truncation='soft' needs max_response_length > 0 and 0 < "
                    "overlong_buffer_len <= max_response_length"
                )
            if not math.isfinite(overlong_penalty_factor) or overlong_penalty_factor < 0:
                raise ConfigError(
                    f"overlong_penalty_factor must be finite and >= 0, got "
                    f"{overlong_penalty_factor}"
                )
        self.backend = backend
        self.truncation = truncation
        self.max_response_length = max_response_length
        self.overlong_buffer_len = overlong_buffer_len
        self.overlong_penalty_factor = overlong_penalty_factor
        # diagnostics and term failures of the last call
        self.last_response: RewardResponse | None = None

    def score_and_attach(
        self, items: Sequence[RewardItem], group_size: int | None = None
    ) -> list[RewardItem]:
        """Score `items` and return new items with `reward` and `component_rewards` set.

        The inputs are never mutated. Any failed, missing or non-finite reward raises
        and names the sample: nothing is attached unless everything is.
        """
        for index, item in enumerate(items):
            if item.reward is not None or item.component_rewards is not None:
                raise PrecomputedRewardError(
                    f"items[{index}] (id={item.id!r}) already carries a reward"
                )
        if self.truncation == "soft":
            for item in items:
                if item.completion_tokens is None:
                    raise MissingTokenCountError(
                        f"item {item.id!r} has no completion_tokens; truncation='soft' needs "
                        f"every completion's length"
                    )
                assert self.max_response_length is not None
                if item.completion_tokens > self.max_response_length:
                    raise MissingTokenCountError(
                        f"item {item.id!r} has {item.completion_tokens} tokens, over "
                        f"max_response_length={self.max_response_length}"
                    )
        request = RewardRequest(items=list(items), group_size=group_size)
        response = self.backend.compute_rewards(request)
        check_response(request, response)
        self.last_response = response
        return [
            item.model_copy(
                update={
                    "reward": self._final(item, response.rewards[i]),
                    "component_rewards": {
                        name: values[i] for name, values in response.component_rewards.items()
                    },
                }
            )
            for i, item in enumerate(request.items)
        ]

    def _final(self, item: RewardItem, reward: float) -> float:
        if self.truncation == "keep":
            return reward
        if self.truncation == "zero":
            return 0.0 if item.is_length_truncated else reward
        return reward + overlong_penalty(
            item.completion_tokens or 0,
            self.max_response_length or 0,
            self.overlong_buffer_len or 0,
            self.overlong_penalty_factor,
        )


def overlong_penalty(
    tokens: int, max_response_length: int, buffer_len: int, factor: float
) -> float:
    """DAPO's soft overlong punishment: 0 up to `max - buffer`, then linear down to `-factor` at
    `max`."""
    over = tokens - (max_response_length - buffer_len)
    return -factor * min(max(over / buffer_len, 0.0), 1.0)


def check_response(request: RewardRequest, response: RewardResponse) -> None:
    """Independent of the backend: ids, success flags and finiteness, per sample."""
    if response.ids != request.ids:
        raise RewardContractError(
            f"backend answered for ids {response.ids[:5]}..., expected {request.ids[:5]}..."
        )
    for i, (item_id, usable) in enumerate(zip(request.ids, response.usable(), strict=True)):
        if not usable:  # failed, not short of an optional term
            raise RewardContractError(
                f"sample {item_id!r} (index {i}) failed: {response.errors[i]}"
            )
    problem = first_non_finite(response)
    if problem is not None:
        raise RewardContractError(problem)
