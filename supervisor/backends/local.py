"""LocalRewardBackend: the scorer in the trainer's own process, same contract as managed."""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from child_runtime.protocol.items import RequestError, request_from_wire
from scorers.base import ScoreInputError, Scorer, ScorerContractError, score_checked
from scorers.identity import scorer_identity_hash
from scorers.registry import resolve_scorer
from supervisor.chunks import CallPlan, ChunkAnswer, score_in_chunks
from supervisor.composition import Component
from supervisor.config import LocalBackendConfig, settings
from supervisor.errors import ConfigError, RewardContractError, ScorerRequestError
from supervisor.outcome import Outcome
from supervisor.shape import ScorerShape, check_pins, check_reward_names
from supervisor.types import RewardItem, RewardRequest

# What a LocalBackendConfig holds that is no setting of the backend's, and why
NOT_SETTINGS = {
    "kind": "the config union's tag",
    "input_kind": "the scorer's own; the config's is for checks before anything starts (doctor, "
    "preflight)",
    "shared_memory_min_bytes": "a managed child's data plane: nothing crosses a process here",
}


class LocalRewardBackend(Component):
    """Builds and loads the scorer at construction; scoring runs the child's validation path.

    `revision` and `identity_hash` are pins, as for a managed child: a scorer that differs
    is refused before it loads. A scorer given as an instance has no identity (its params are
    unknown here) and cannot be pinned: give it by name and params for that.

    Calls are serialised, as a managed child's are: one backend may serve several panels
    (training and validation) from their threads, and most scorers are not thread-safe.
    Within a call, the chunks go to the scorer together only when it declares
    `concurrent_calls` (math_verify's pool takes batches from several threads).
    """

    shape: ScorerShape  # what the scorer declared (its child's readiness line or /health)

    def __init__(  # noqa: PLR0913 - every keyword is a field of LocalBackendConfig (test_settings_once)
        self,
        scorer: str | Scorer,
        params: Mapping[str, Any] | None = None,
        device: str = "cpu",
        required_rewards: Sequence[str] | None = None,
        weights: Mapping[str, float] | None = None,
        request_batch_size: int = 64,
        group_size: int | None = None,
        revision: str | None = None,
        identity_hash: str | None = None,
        catalog: str | None = None,
        time_chunks: bool = False,
    ) -> None:
        if request_batch_size <= 0:
            raise ValueError("request_batch_size must be > 0")
        params = dict(params or {})
        if isinstance(scorer, str):
            self.scorer = resolve_scorer(scorer, catalog)(**params)
            identity: str | None = scorer_identity_hash(self.scorer, params)
        else:
            if params or revision is not None or identity_hash is not None:
                raise ConfigError(
                    "a scorer instance takes no params and cannot be pinned (its constructor "
                    "arguments are unknown here): give the scorer by name, with params, to pin it"
                )
            self.scorer, identity = scorer, None
        spec = self.scorer.spec
        self.shape = ScorerShape.of_spec(spec, identity)
        check_pins(self.shape, revision, identity_hash)
        self.weights = dict(weights or {})
        self.required_rewards = check_reward_names(
            spec.name, spec.term_names(), required_rewards or [], self.weights
        )
        self.request_batch_size = request_batch_size
        self.group_size = group_size
        self.time_chunks = time_chunks  # each chunk timed into the response (supervisor.chunks)
        self._serial = threading.RLock()
        self._scorer_closed = False
        self.scorer.load(device)
        self.scorer.onload()
        self._closed = False

    @classmethod
    def from_config(cls, config: LocalBackendConfig) -> LocalRewardBackend:
        """The backend a recipe (or the CLI) describes, every setting passed by its name: the
        scorer's (its `name` is `scorer`) and the client's."""
        keywords = settings(config, flatten=("scorer", "client"), leave={*NOT_SETTINGS, "name"})
        return cls(config.scorer.name, **keywords)

    @property
    def combination(self) -> dict[str, Any]:
        return {
            "required": list(self.required_rewards),
            "weights": dict(sorted(self.weights.items())),
        }

    def score_chunk(self, chunk: Sequence[RewardItem], group_size: int | None) -> ChunkAnswer:
        """One chunk through the child's own validation path (this backend is its ChunkScorer)."""
        try:
            items, group_size = request_from_wire(
                {"items": [item.to_wire() for item in chunk], "group_size": group_size},
                copy_media=self.scorer.spec.writable_inputs,
            )
            result = score_checked(self.scorer, items, group_size)
        except (RequestError, ScoreInputError) as exc:
            raise ScorerRequestError(str(exc), kind="bad_input") from exc
        except ScorerContractError as exc:
            raise RewardContractError(str(exc)) from exc
        except Exception as exc:  # noqa: BLE001 - the scorer's own bug: typed as a managed child's 500 is
            raise ScorerRequestError(f"{type(exc).__name__}: {exc}", kind="scorer_error") from exc
        terms = {
            name: np.asarray(values, dtype=np.float64) for name, values in result.terms.items()
        }
        term_failed = {
            name: {chunk[position].id: why for position, why in whys.items()}
            for name, whys in result.term_failed.items()
        }
        failed = {chunk[position].id: why for position, why in result.failed.items()}
        not_applicable = {
            name: frozenset(chunk[position].id for position in where)
            for name, where in result.not_applicable.items()
        }
        details = {chunk[position].id: said for position, said in result.details.items()}
        return ChunkAnswer(terms, result.diagnostics, failed, term_failed, not_applicable, details)

    def score(self, request: RewardRequest) -> Outcome:
        return self.score_batched(request, self.request_batch_size)

    def score_batched(self, request: RewardRequest, batch_size: int) -> Outcome:
        """`score`, its chunks of at most `batch_size` items (a `BatchView` sharing this scorer)."""
        with self._serial:
            if self._closed:
                raise RuntimeError("LocalRewardBackend is closed")
            try:
                plan = CallPlan(
                    self.shape,
                    batch_size,
                    self.required_rewards,
                    self.weights,
                    self.group_size,
                    time_chunks=self.time_chunks,
                )
                return score_in_chunks(request, plan, self)
            finally:
                if self._closed:  # close() came from another thread meanwhile and left this to us
                    self._close_scorer()

    def onload(self) -> dict[str, Any]:
        with self._serial:
            return dict(self.scorer.onload() or {})

    def offload(self) -> dict[str, Any]:
        with self._serial:
            return dict(self.scorer.offload() or {})

    def close(self) -> None:
        """Idempotent, and never waits for a call running in another thread (a panel's, after
        Ctrl-C): that call closes the scorer when it ends."""
        self._stop_submissions()
        self._closed = True
        if self._serial.acquire(blocking=False):
            try:
                self._close_scorer()
            finally:
                self._serial.release()

    def _close_scorer(self) -> None:
        if not self._scorer_closed:
            self._scorer_closed = True
            self.scorer.close()
