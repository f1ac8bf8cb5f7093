"""Trainer-facing request and response types."""

from __future__ import annotations

import json
import math
from typing import Annotated, Any

import numpy as np
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, JsonValue, model_validator

from child_runtime.items import check_media


def _as_image(value: Any) -> np.ndarray | None:
    """Accept a uint8 HWC ndarray or anything with `__array_interface__` (a PIL image)."""
    if value is None:
        return None
    if not isinstance(value, np.ndarray):
        if not hasattr(value, "__array_interface__"):
            raise ValueError(f"image must be a uint8 ndarray or a PIL image, got {type(value).__name__}")
        value = np.asarray(value)
        if value.ndim == 2:
            value = value[:, :, None]
    return check_media(value, "image", "item")


def _as_video(value: Any) -> np.ndarray | None:
    return None if value is None else check_media(value, "video", "item")


Image = Annotated[Any, BeforeValidator(_as_image)]
Video = Annotated[Any, BeforeValidator(_as_video)]


class RewardItem(BaseModel):
    """One rollout to score. `reward` stays None until RewardService attaches one."""

    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)

    id: str = Field(min_length=1)
    group_id: str | None = None
    prompt: str | None = None
    text: str | None = None
    image: Image = None
    video: Video = None
    reference: JsonValue = None
    metadata: dict[str, JsonValue] = Field(default_factory=dict)
    finish_reason: str | None = None
    reward: float | None = None
    component_rewards: dict[str, float] | None = None

    @model_validator(mode="after")
    def _json_safe(self) -> RewardItem:
        for name in ("reference", "metadata"):
            try:
                json.dumps(getattr(self, name), allow_nan=False)
            except ValueError as exc:
                raise ValueError(f"{name} must be finite JSON: {exc}") from exc
        return self

    def to_wire(self) -> dict[str, Any]:
        """The child's item schema: only what a scorer reads."""
        wire: dict[str, Any] = {"id": self.id}
        for key in ("group_id", "prompt", "text", "image", "video", "reference"):
            value = getattr(self, key)
            if value is not None:
                wire[key] = value
        if self.metadata:
            wire["metadata"] = self.metadata
        return wire


class RewardRequest(BaseModel):
    """An ordered batch; ids must be unique so every reward has exactly one owner."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    items: list[RewardItem] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique_ids(self) -> RewardRequest:
        seen: set[str] = set()
        for index, item in enumerate(self.items):
            if item.id in seen:
                raise ValueError(f"items[{index}].id {item.id!r} is not unique in the request")
            seen.add(item.id)
        return self

    @property
    def ids(self) -> list[str]:
        return [item.id for item in self.items]


class RewardResponse(BaseModel):
    """Rewards in request order, with per-term components and per-item success."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    ids: list[str]
    rewards: list[float]
    component_rewards: dict[str, list[float]]
    successes: list[bool]
    errors: list[str | None]
    diagnostics: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _aligned(self) -> RewardResponse:
        n = len(self.ids)
        lengths = {"rewards": len(self.rewards), "successes": len(self.successes), "errors": len(self.errors)}
        lengths.update({f"component_rewards[{k!r}]": len(v) for k, v in self.component_rewards.items()})
        for name, length in lengths.items():
            if length != n:
                raise ValueError(f"{name} has {length} entries for {n} ids")
        for index, (ok, value) in enumerate(zip(self.successes, self.rewards, strict=True)):
            if ok and not math.isfinite(value):
                raise ValueError(f"rewards[{index}] (id={self.ids[index]!r}) is {value} but marked a success")
        return self
