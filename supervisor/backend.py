"""The one interface a trainer calls, whatever runs the scorer."""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Mapping, Sequence

import numpy as np

from supervisor.types import RewardRequest, RewardResponse


class RewardBackend(ABC):
    """`compute_rewards` plus residency and lifecycle; usable as a context manager."""

    @abstractmethod
    def compute_rewards(self, request: RewardRequest) -> RewardResponse: ...

    def onload(self) -> dict[str, Any]:
        return {}

    def offload(self) -> dict[str, Any]:
        return {}

    def drain(self) -> dict[str, Any]:
        return {}

    def close(self) -> None:
        """Release everything; idempotent and bounded."""

    def __enter__(self) -> "RewardBackend":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def chunks(items: Sequence[Any], size: int) -> list[Sequence[Any]]:
    return [items[i : i + size] for i in range(0, len(items), size)]


def merge_diagnostics(parts: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Sum numbers and concatenate lists across chunks; other values: last one wins."""
    merged: dict[str, Any] = {}
    for part in parts:
        for key, value in part.items():
            if key in merged and isinstance(value, (int, float)) and not isinstance(value, bool):
                merged[key] += value
            elif key in merged and isinstance(value, list):
                merged[key] = merged[key] + value
            else:
                merged[key] = value
    return merged


def assemble_response(
    ids: list[str],
    terms: Mapping[str, np.ndarray],
    required: Sequence[str],
    weights: Mapping[str, float],
    diagnostics: Mapping[str, Any],
) -> RewardResponse:
    """final = sum(weight * term) over the required terms; every item a success or we raised."""
    rewards = np.zeros(len(ids), dtype=np.float64)
    for term in required:
        rewards += weights.get(term, 1.0) * terms[term]
    return RewardResponse(
        ids=ids,
        rewards=rewards.tolist(),
        component_rewards={name: np.asarray(values, dtype=np.float64).tolist() for name, values in terms.items()},
        successes=[True] * len(ids),
        errors=[None] * len(ids),
        diagnostics=dict(diagnostics),
    )
