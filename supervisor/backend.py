"""The one interface a trainer calls, whatever runs the scorer."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Self

import numpy as np

from supervisor.errors import ConfigError, RewardContractError
from supervisor.segment import HeapArena, SharedArena
from supervisor.types import RewardItem, RewardRequest, RewardResponse

ChunkScorer = Callable[[Sequence[RewardItem]], tuple[Mapping[str, np.ndarray], Mapping[str, Any]]]


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

    def arena(self) -> SharedArena | HeapArena:
        """Where to build large input arrays before scoring them. A managed child's arena is in
        its shared segment, so those arrays reach the scorer without a copy; elsewhere it is
        ordinary memory. Arrays are valid until the arena is closed (use it as a context manager)."""
        return HeapArena()

    def close(self) -> None:  # noqa: B027 - optional: most backends have something to release
        """Release everything; idempotent and bounded."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def check_reward_names(
    scorer: str, terms: Sequence[str], required: Sequence[str], weights: Mapping[str, float]
) -> list[str]:
    """The terms that make the reward (default: all of the scorer's); unknown names are a ConfigError."""
    required = list(required) or list(terms)
    unknown = sorted((set(required) | set(weights)) - set(terms))
    if unknown:
        raise ConfigError(
            f"required_rewards/weights {unknown} are not terms of scorer {scorer!r} (it has {list(terms)})"
        )
    return required


def score_in_chunks(
    request: RewardRequest, size: int, score_chunk: ChunkScorer, required: Sequence[str], weights: Mapping[str, float]
) -> RewardResponse:
    """Score `size`-item chunks in order, then assemble one response for the whole request."""
    parts: dict[str, list[np.ndarray]] = {}
    diagnostics = []
    for start in range(0, len(request.items), size):
        terms, diag = score_chunk(request.items[start : start + size])
        for name, values in terms.items():
            parts.setdefault(name, []).append(np.asarray(values, dtype=np.float64))
        diagnostics.append(diag)
    merged = {name: np.concatenate(values) for name, values in parts.items()}
    return assemble_response(request.ids, merged, required, weights, merge_diagnostics(diagnostics))


def merge_diagnostics(parts: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Diagnostics are counts (summed across chunks) and lists (concatenated); else last wins."""
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
    bad = np.flatnonzero(~np.isfinite(rewards))
    if bad.size:
        raise RewardContractError(
            f"weighted reward for id {ids[int(bad[0])]!r} is {rewards[int(bad[0])]} (weights {dict(weights)})"
        )
    return RewardResponse(
        ids=ids,
        rewards=rewards.tolist(),
        component_rewards={name: np.asarray(values, dtype=np.float64).tolist() for name, values in terms.items()},
        successes=[True] * len(ids),
        errors=[None] * len(ids),
        diagnostics=dict(diagnostics),
    )
