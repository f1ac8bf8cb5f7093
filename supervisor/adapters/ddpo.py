"""DDPO / flow-GRPO: `reward_fn(images, prompts, metadata) -> (rewards, info)`.

Images arrive as the pipeline produced them (float NCHW in [0, 1] for DDPO and flow-GRPO,
as arrays or torch CPU tensors); the caller declares the range. They are converted once,
straight into the backend's arena, so a managed child reads them without a further copy.
The gold for a reward, if any, comes from each item's metadata (`reference_key`).
`style="flow_grpo"` returns flow-GRPO's shape instead: `({term: [...], "avg": [...]}, {})`,
and the call accepts flow-GRPO's extra keywords (`only_strict`).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np

from supervisor.adapters import items as adapter_items
from supervisor.adapters.images import Layout, OutputRange, to_uint8_hwc
from supervisor.backend import RewardBackend
from supervisor.composition import component

_CALLS = itertools.count()


class DDPORewardFn:
    """A reward function object for DDPO-style trainers; `__name__` is the scorer's name."""

    def __init__(
        self,
        backend: RewardBackend,
        output_range: OutputRange,
        layout: Layout = "NCHW",
        reference_key: str | None = None,
        name: str | None = None,
        style: Literal["ddpo", "flow_grpo"] = "ddpo",
    ) -> None:
        if style not in ("ddpo", "flow_grpo"):
            raise ValueError(f"style must be 'ddpo' or 'flow_grpo', got {style!r}")
        self.style = style
        self.backend = backend
        self.output_range = output_range
        self.layout = layout
        self.reference_key = reference_key
        shape = component(backend).shape
        self.__name__ = name or (shape.name if shape else "reward")

    def __call__(
        self,
        images: Any,
        prompts: Sequence[str],
        metadata: Sequence[Mapping[str, Any]] | None = None,
        **_: Any,
    ) -> tuple[Any, dict[str, Any]]:
        call = next(_CALLS)
        with self.backend.arena() as arena:
            batch = to_uint8_hwc(images, self.output_range, self.layout, allocate=arena.empty)
            if len(prompts) != len(batch) or (metadata is not None and len(metadata) != len(batch)):
                raise ValueError(
                    f"{len(batch)} images, {len(prompts)} prompts, {len(metadata or [])} metadata"
                )
            items = [
                adapter_items.item(
                    f"{self.style} image {i}",
                    id=f"ddpo{call}-{i}",
                    image=batch[i],
                    prompt=prompts[i],
                    reference=self._reference(metadata[i]) if metadata is not None else None,
                )
                for i in range(len(batch))
            ]
            response = self.backend.compute_rewards(
                adapter_items.request(f"{self.style} reward_fn", items)
            )
        if self.style == "flow_grpo":  # the weighted total is "avg"; each term's scores beside it
            # a term with no value for an item (see verl's _scores): NaN in its log column
            nan = float("nan")
            details: dict[str, list[Any]] = {
                name: [nan if v is None else v for v in values]
                for name, values in response.component_rewards.items()
            }
            if "avg" in details:
                raise ValueError(
                    "a term named 'avg' would hide flow-GRPO's weighted total: rename it"
                )
            details["avg"] = list(response.rewards)
            return details, {}
        rewards = np.asarray(response.rewards, dtype=np.float32)
        info = {"component_rewards": response.component_rewards, "metrics": response.metrics()}
        return rewards, info

    def _reference(self, metadata: Mapping[str, Any]) -> Any:
        if self.reference_key is None:
            return None
        if self.reference_key not in metadata:
            raise KeyError(f"metadata has no {self.reference_key!r} (keys: {sorted(metadata)})")
        return metadata[self.reference_key]
