"""What the managed and remote backends share: framed scoring over HTTP, checked answers."""
from __future__ import annotations

from typing import Any, Callable, Sequence, TypeVar

import numpy as np

from child_runtime import wire
from supervisor.backend import RewardBackend
from supervisor.client import ChildClient
from supervisor.errors import ChildRecord, ScorerRequestError
from supervisor.types import RewardItem
from supervisor.verify import verify_score_answer

T = TypeVar("T")


class HttpScoringBackend(RewardBackend):
    """Subclasses own the connection and say how transport failures map to typed errors."""

    required_rewards: list[str]
    max_request_bytes: int | None = None  # refuse before sending what the server would refuse

    def _call(self, what: str, fn: Callable[[ChildClient], T], restart: bool = False) -> T:
        """Run `fn` on the client; `restart` lets a managed backend replace a dead child first."""
        raise NotImplementedError

    def _record(self) -> ChildRecord | None:
        return None

    def _score_chunk(self, chunk: Sequence[RewardItem]) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        try:
            frame = wire.prepare({"items": [item.to_wire() for item in chunk]})
        except wire.WireError as exc:
            raise ScorerRequestError(f"cannot encode request: {exc}", kind="bad_input") from exc
        size = frame.body_size()  # one limit, whichever way the arrays travel
        if self.max_request_bytes is not None and size > self.max_request_bytes:
            raise ScorerRequestError(f"request of {size} bytes exceeds max_request_bytes={self.max_request_bytes}; "
                                     "lower request_batch_size", status=413, kind="too_large")
        ids = [item.id for item in chunk]
        # verified inside the call, so a backend can act on the connection that gave the answer
        return self._call("score", lambda client: verify_score_answer(client.score(frame), ids,
                                                                       self.required_rewards, self._record),
                          restart=True)

    def health(self) -> dict[str, Any]:
        return self._call("health", lambda client: client.health())

    def onload(self) -> dict[str, Any]:
        return self._call("onload", lambda client: client.onload())

    def offload(self) -> dict[str, Any]:
        return self._call("offload", lambda client: client.offload())
