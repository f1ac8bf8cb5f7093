"""LocalRewardBackend: the scorer in the trainer's own process, same contract as managed."""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from child_runtime.items import RequestError, items_from_wire
from scorers.base import ScoreInputError, Scorer, ScorerContractError, score_checked
from scorers.registry import resolve_scorer
from supervisor.backend import RewardBackend, assemble_response, chunks, merge_diagnostics
from supervisor.errors import RewardContractError, ScorerRequestError
from supervisor.types import RewardRequest, RewardResponse


class LocalRewardBackend(RewardBackend):
    """Builds and loads the scorer at construction; scoring runs the child's validation path."""

    def __init__(
        self,
        scorer: str | Scorer,
        params: Mapping[str, Any] | None = None,
        device: str = "cpu",
        required_rewards: Sequence[str] | None = None,
        weights: Mapping[str, float] | None = None,
        request_batch_size: int = 64,
    ) -> None:
        if request_batch_size <= 0:
            raise ValueError("request_batch_size must be > 0")
        self.scorer = resolve_scorer(scorer)(**dict(params or {})) if isinstance(scorer, str) else scorer
        self.required = list(required_rewards or self.scorer.spec.term_names())
        self.weights = dict(weights or {})
        unknown = [name for name in self.required if name not in self.scorer.spec.term_names()]
        if unknown:
            raise ValueError(f"required rewards {unknown} are not terms of scorer {self.scorer.spec.name!r}")
        self.request_batch_size = request_batch_size
        self.scorer.load(device)
        self.scorer.onload()
        self._closed = False

    def compute_rewards(self, request: RewardRequest) -> RewardResponse:
        if self._closed:
            raise RuntimeError("LocalRewardBackend is closed")
        terms: dict[str, list[np.ndarray]] = {}
        diagnostics = []
        for chunk in chunks(request.items, self.request_batch_size):
            try:
                items = items_from_wire({"items": [item.to_wire() for item in chunk]})
                result = score_checked(self.scorer, items)
            except (RequestError, ScoreInputError) as exc:
                raise ScorerRequestError(str(exc), kind="bad_input") from exc
            except ScorerContractError as exc:
                raise RewardContractError(str(exc)) from exc
            for name, values in result.terms.items():
                terms.setdefault(name, []).append(np.asarray(values, dtype=np.float64))
            diagnostics.append(result.diagnostics)
        merged = {name: np.concatenate(parts) for name, parts in terms.items()}
        return assemble_response(request.ids, merged, self.required, self.weights, merge_diagnostics(diagnostics))

    def onload(self) -> dict[str, Any]:
        return dict(self.scorer.onload() or {})

    def offload(self) -> dict[str, Any]:
        return dict(self.scorer.offload() or {})

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.scorer.close()
