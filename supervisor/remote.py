"""RemoteRewardBackend: a scorer server someone else started, same contract and checks."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import numpy as np

from supervisor.backend import RewardBackend, check_reward_names, score_in_chunks
from supervisor.client import ScorerClient
from supervisor.errors import ErrorStatus, TransportError, scorer_error
from supervisor.types import RewardItem, RewardRequest, RewardResponse
from supervisor.verify import encode_chunk, verify_score_answer

T = TypeVar("T")


class RemoteRewardBackend(RewardBackend):
    """HTTP client for a running scorer server (e.g. `python -m child_runtime` on another host).

    The server's identity and terms are read from /health at construction, so a
    wrong URL or token fails there, not in the first training step. The server is not
    ours: a failure never stops or restarts it.
    """

    def __init__(
        self,
        base_url: str,
        token: str | None = None,
        request_timeout: float = 600.0,
        request_batch_size: int = 64,
        required_rewards: Sequence[str] = (),
        weights: Mapping[str, float] | None = None,
        max_request_bytes: int | None = None,
    ) -> None:
        if request_batch_size <= 0:
            raise ValueError("request_batch_size must be > 0")
        self.base_url = base_url
        self.request_batch_size = request_batch_size
        self.weights = dict(weights or {})
        self.max_request_bytes = max_request_bytes  # refuse before sending what the server would refuse
        self._client = ScorerClient.remote(base_url, token, request_timeout)
        try:
            self.server = self.health()
            self.required_rewards = check_reward_names(
                self.server["scorer"], self.server["terms"], required_rewards, self.weights
            )
        except BaseException:
            self._client.close()
            raise

    def _exchange(self, what: str, call: Callable[..., T], *args: Any) -> T:
        try:
            return call(*args)
        except (TransportError, ErrorStatus) as exc:
            raise scorer_error(exc, f"{what} at {self.base_url}") from exc

    def _score_chunk(self, chunk: Sequence[RewardItem]) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        frame = encode_chunk(chunk, self.max_request_bytes)
        answer = self._exchange("score", self._client.score, frame)
        return verify_score_answer(answer, [item.id for item in chunk], self.required_rewards)

    def compute_rewards(self, request: RewardRequest) -> RewardResponse:
        return score_in_chunks(request, self.request_batch_size, self._score_chunk, self.required_rewards, self.weights)

    def health(self) -> dict[str, Any]:
        return self._exchange("health", self._client.health)

    def onload(self) -> dict[str, Any]:
        return self._exchange("onload", self._client.onload)

    def offload(self) -> dict[str, Any]:
        return self._exchange("offload", self._client.offload)

    def drain(self, timeout_s: float = 600.0) -> dict[str, Any]:
        return self._exchange("drain", self._client.drain, timeout_s)

    def close(self) -> None:
        """Closes connections only: the server belongs to whoever started it."""
        self._client.close()
