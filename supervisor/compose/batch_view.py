"""`BatchView`: one backend's child (or in-process scorer) called with another request batch size.

Why: a batch size is how a caller cuts its calls, not what scores them. FF's training and eval
entries of one model share one loaded model whatever their `batch_size`; here they share one
backend (one child), and the entry whose batch size differs from the one the backend was built with
scores through this view, which cuts its calls at its own size. It owns nothing: the backend is
closed by whoever holds it (the recipe's `BackendPool`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from supervisor.backend import RewardBackend
from supervisor.composition import Wrapper, component
from supervisor.errors import ConfigError
from supervisor.outcome import Outcome
from supervisor.shape import ScorerShape
from supervisor.types import RewardRequest


class Rebatchable(Protocol):
    """A backend that can cut one call at a batch size other than its configured one."""

    def score_batched(self, request: RewardRequest, batch_size: int) -> Outcome: ...


class BatchView(Wrapper):
    """`backend`, its calls cut into chunks of at most `batch_size` items (never splitting a
    group)."""

    def __init__(self, backend: RewardBackend, batch_size: int) -> None:
        if not callable(getattr(backend, "score_batched", None)):
            raise ConfigError(
                f"{type(backend).__name__} cannot score at another batch size: give the terms "
                "that share it the same request_batch_size"
            )
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ConfigError(f"batch_size must be a positive int, got {batch_size!r}")
        self.backend = backend
        self.batch_size = batch_size

    def score(self, request: RewardRequest) -> Outcome:
        scorer: Rebatchable = self.backend  # type: ignore[assignment]  # checked at construction
        return scorer.score_batched(request, self.batch_size)

    @property
    def shape(self) -> ScorerShape | None:  # type: ignore[override]  # the backend's
        return component(self.backend).shape

    @property
    def identity_hash(self) -> str | None:
        return component(self.backend).identity_hash

    @property
    def combination(self) -> dict[str, Any] | None:
        return component(self.backend).combination

    @property
    def group_size(self) -> int | None:  # type: ignore[override]  # the backend's
        return component(self.backend).group_size

    def members(self) -> Sequence[RewardBackend]:
        return [self.backend]

    def close(self) -> None:
        """Stops its own submissions only: the backend is its holder's to close."""
        self._stop_submissions()


def shared_key(config: dict[str, Any]) -> dict[str, Any]:
    """What decides whether two terms share a backend: its config, less the client's
    `request_batch_size` where the backend can score at another (a managed child of one replica,
    an in-process scorer), so that entries differing only in batch size share one child."""
    client = config.get("client")
    if not _rebatchable(config) or not isinstance(client, dict):
        return config
    return {**config, "client": {k: v for k, v in client.items() if k != "request_batch_size"}}


def term_backend(backend: RewardBackend, config: dict[str, Any]) -> RewardBackend:
    """The pool's `backend` as the term `config` describes it: itself, or a `BatchView` at the
    term's own request batch size when the backend was built with another."""
    if not _rebatchable(config):
        return backend
    wanted = config.get("client", {}).get("request_batch_size")
    spec = getattr(backend, "spec", None)
    built = (
        spec.client.request_batch_size
        if spec is not None
        else getattr(backend, "request_batch_size", None)
    )
    return backend if wanted is None or wanted == built else BatchView(backend, wanted)


def _rebatchable(config: dict[str, Any]) -> bool:
    if config.get("kind") == "local":
        return True
    replicas = config.get("replicas") or {}
    return (
        config.get("kind") == "managed"
        and replicas.get("count", 1) == 1
        and len(replicas.get("devices") or []) <= 1
    )
