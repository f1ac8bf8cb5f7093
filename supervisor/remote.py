"""RemoteRewardBackend: a scorer server someone else started, same contract and checks."""
from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence, TypeVar

from supervisor.backend import check_reward_names, score_in_chunks
from supervisor.client import ChildClient, ChildHTTPError, ChildProtocolError, ChildTransportError
from supervisor.errors import RewardContractError, ScorerRequestError, ScorerTimeout, ScorerUnavailable
from supervisor.http_backend import HttpScoringBackend
from supervisor.types import RewardRequest, RewardResponse

T = TypeVar("T")


class RemoteRewardBackend(HttpScoringBackend):
    """HTTP client for a running scorer server (e.g. `python -m child_runtime` on another host).

    The server's identity and terms are read from /health at construction, so a
    wrong URL or token fails there, not in the first training step.
    """

    def __init__(self, base_url: str, token: str | None = None, request_timeout: float = 600.0,
                 request_batch_size: int = 64, required_rewards: Sequence[str] = (),
                 weights: Mapping[str, float] | None = None) -> None:
        if request_batch_size <= 0:
            raise ValueError("request_batch_size must be > 0")
        self.base_url = base_url
        self.request_batch_size = request_batch_size
        self.weights = dict(weights or {})
        self._client = ChildClient(base_url, token, request_timeout)
        try:
            self.server = self.health()
            self.required_rewards = check_reward_names(self.server["scorer"], self.server["terms"], required_rewards,
                                               self.weights)
        except BaseException:
            self._client.close()
            raise

    def _call(self, what: str, fn: Callable[[ChildClient], T], restart: bool = False) -> T:
        try:
            return fn(self._client)
        except ChildHTTPError as exc:
            raise ScorerRequestError(f"{what} at {self.base_url}: HTTP {exc.status} ({exc.kind}): {exc.message}",
                                     status=exc.status, kind=exc.kind) from exc
        except ChildProtocolError as exc:
            raise RewardContractError(f"{what} at {self.base_url}: {exc}") from exc
        except ChildTransportError as exc:
            error = ScorerTimeout if exc.timed_out else ScorerUnavailable
            raise error(f"{what} at {self.base_url}: {exc}") from exc

    def compute_rewards(self, request: RewardRequest) -> RewardResponse:
        return score_in_chunks(request, self.request_batch_size, self._score_chunk, self.required_rewards, self.weights)

    def drain(self, timeout_s: float = 600.0) -> dict[str, Any]:
        return self._call("drain", lambda client: client.drain(timeout_s))

    def close(self) -> None:
        """Closes connections only: the server belongs to whoever started it."""
        self._client.close()
