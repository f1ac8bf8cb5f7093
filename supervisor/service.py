"""RewardService: the trainer's single entry point; a bad reward stops the step."""

from __future__ import annotations

import math
from collections.abc import Sequence

from supervisor.backend import RewardBackend
from supervisor.errors import RewardContractError
from supervisor.types import RewardItem, RewardRequest, RewardResponse


class PrecomputedRewardError(ValueError):
    """An item already carries a reward; the service is the only writer."""


class RewardService:
    def __init__(self, backend: RewardBackend) -> None:
        self.backend = backend

    def score_and_attach(self, items: Sequence[RewardItem]) -> list[RewardItem]:
        """Score `items` and return new items with `reward` and `component_rewards` set.

        The inputs are never mutated. Any failed, missing or non-finite reward raises
        and names the sample: nothing is attached unless everything is.
        """
        for index, item in enumerate(items):
            if item.reward is not None or item.component_rewards is not None:
                raise PrecomputedRewardError(f"items[{index}] (id={item.id!r}) already carries a reward")
        request = RewardRequest(items=list(items))
        response = self.backend.compute_rewards(request)
        check_response(request, response)
        return [
            item.model_copy(
                update={
                    "reward": response.rewards[i],
                    "component_rewards": {name: values[i] for name, values in response.component_rewards.items()},
                }
            )
            for i, item in enumerate(request.items)
        ]


def check_response(request: RewardRequest, response: RewardResponse) -> None:
    """Independent of the backend: ids, success flags and finiteness, per sample."""
    if response.ids != request.ids:
        raise RewardContractError(f"backend answered for ids {response.ids[:5]}..., expected {request.ids[:5]}...")
    for i, item_id in enumerate(request.ids):
        if not response.successes[i]:
            raise RewardContractError(f"sample {item_id!r} (index {i}) failed: {response.errors[i]}")
        if not math.isfinite(response.rewards[i]):
            raise RewardContractError(f"sample {item_id!r} (index {i}) has non-finite reward {response.rewards[i]}")
        for name, values in response.component_rewards.items():
            if not math.isfinite(values[i]):
                raise RewardContractError(f"sample {item_id!r} (index {i}) term {name!r} is {values[i]}")
