"""RemoteRewardBackend: a scorer server someone else started, same contract and checks.

The network between here and there may drop a connection or a proxy may answer 502/503:
every operation here is idempotent (score carries an idempotency key, the same on every
try, so the server answers a re-send from its cache instead of scoring twice), so a
failed try is repeated with capped exponential backoff, within the first try's deadline.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any, TypeVar

from child_runtime.protocol import wire
from scorers.common.bounded_http import Cancel
from scorers.common.retry import Retry
from supervisor.child.client import DEFAULT_MAX_ANSWER_BYTES, MAX_CONNECTIONS, ScorerClient
from supervisor.chunks import CallPlan, ChunkAnswer, score_in_chunks
from supervisor.composition import Component
from supervisor.config import RemoteBackendConfig, settings
from supervisor.errors import (
    ConnectFailed,
    ConnectionLost,
    ErrorStatus,
    NoAnswer,
    RewardContractError,
    ScorerUnavailable,
    TransportError,
    scorer_error,
)
from supervisor.outcome import Outcome
from supervisor.shape import ScorerShape, check_pins, reward_terms
from supervisor.types import RewardItem, RewardRequest
from supervisor.verify import encode_chunk, verify_score_answer

T = TypeVar("T")
log = logging.getLogger(__name__)


# A server at fault that another server may serve the request for, but that must not be sent it
# again: a served panel's term that died or passed its deadline (each try here would restart that
# term's child, and the tries would crash-loop it), a scorer wedged on a thread it cannot stop (it
# refuses every call)
FAIL_OVER_ONLY = (wire.SERVER_FAULT, *wire.RESTART_KINDS)

# What a RemoteBackendConfig holds that is no setting of one server's client, and why
NOT_SETTINGS = {
    "kind": "the config union's tag",
    "token_env": "the token's variable: its value is the runtime-only `token`",
    "input_kind": "the server's own kind; the config's is for checks before anything starts "
    "(doctor, preflight)",
    "shared_memory_min_bytes": "a managed child's data plane: a server is reached over the network",
    "probe_timeout_s": "several servers only (MultiRemoteRewardBackend)",
    "probe_interval_s": "several servers only (MultiRemoteRewardBackend)",
    "hedge": "several servers only (MultiRemoteRewardBackend)",
}


def retryable(exc: Exception) -> bool:
    """Worth sending to the same server again: nothing usable came back, or the server (or a proxy)
    says try later. Any other 4xx is final, and so is an answer that is not the protocol, a scorer
    server's own verdict that its scorer failed (a 500 of kind scorer_error or contract: the same
    request fails again), and a fault of that server's (`FAIL_OVER_ONLY`)."""
    if isinstance(exc, ErrorStatus):
        if (
            exc.status == 500
            and exc.kind in ("scorer_error", "contract")
            or exc.kind in FAIL_OVER_ONLY
        ):
            return False
        return exc.status == 429 or exc.status >= 500
    return isinstance(exc, (ConnectFailed, ConnectionLost, NoAnswer))


def fixable_elsewhere(exc: Exception) -> bool:
    """Another server of the same identity may serve what failed here: what is retryable, and a
    fault of this server's that sending it here again would repeat."""
    return retryable(exc) or (isinstance(exc, ErrorStatus) and exc.kind in FAIL_OVER_ONLY)


def answered_by(shape: ScorerShape, base_url: str) -> str:
    """The identity every answer of the server at `base_url` must name: the one its /health
    reports."""
    if not isinstance(shape.identity_hash, str) or not shape.identity_hash:
        raise RewardContractError(
            f"/health at {base_url} names no identity_hash: is it a managed-scorers server?"
        )
    return shape.identity_hash


class RemoteRewardBackend(Component):
    """HTTP client for a running scorer server (e.g. `python -m child_runtime` on another host).

    The server's identity and terms are read from /health at construction, so a
    wrong URL or token fails there, not in the first training step. Every answer must then
    come from that identity (or the `identity_hash` pin): a server restarted under another
    revision or params fails the call with `ScorerIdentityChanged`, never retried. The server
    is not ours: a failure never stops or restarts it.
    """

    shape: ScorerShape  # what the scorer declared (its child's readiness line or /health)

    def __init__(  # noqa: PLR0913 - every keyword is a field of RemoteBackendConfig (test_settings_once)
        self,
        base_url: str,
        token: str | None = None,
        request_timeout: float = 600.0,
        request_batch_size: int = 64,
        required_rewards: Sequence[str] = (),
        weights: Mapping[str, float] | None = None,
        max_request_bytes: int | None = None,
        group_size: int | None = None,
        revision: str | None = None,
        identity_hash: str | None = None,
        max_retries: int = 3,
        retry_backoff_s: float = 0.1,
        retry_backoff_cap_s: float = 2.0,
        max_answer_bytes: int = DEFAULT_MAX_ANSWER_BYTES,
        time_chunks: bool = False,
    ) -> None:
        """`request_timeout` bounds each exchange as a whole (connect, send, wait, read, and its
        retries), however the server sends; an answer over `max_answer_bytes`, or compressed, is
        refused."""
        _check_settings(
            base_url,
            request_batch_size,
            max_answer_bytes,
            max_retries,
            retry_backoff_s,
            retry_backoff_cap_s,
        )
        self.max_retries = max_retries  # tries after the first, for operations that are idempotent
        self.retry_backoff_s = retry_backoff_s
        self.retry_backoff_cap_s = retry_backoff_cap_s
        self.base_url = base_url
        self.request_batch_size = request_batch_size
        self.group_size = group_size
        self.weights = dict(weights or {})
        self.time_chunks = time_chunks  # each chunk timed into the response (supervisor.chunks)
        # refuse before sending what the server would refuse
        self.max_request_bytes = max_request_bytes
        self._stopped = threading.Event()  # closed: no call retries, none starts
        # set (then replaced) by interrupt(): the calls in flight end
        self._interrupted = threading.Event()
        self._client = ScorerClient.remote(base_url, token, request_timeout, max_answer_bytes)
        self._meet_server(required_rewards, revision, identity_hash)

    def _meet_server(
        self, required_rewards: Sequence[str], revision: str | None, identity_hash: str | None
    ) -> None:
        """The server's identity and terms, from /health, so a wrong URL or token fails here; the
        client is closed on any failure."""
        try:
            self.server = self.health()
            self.shape = ScorerShape.from_entry(self.server, f"/health at {self.base_url}")
            check_pins(self.shape, revision, identity_hash)
            # every answer must come from it
            self._client.identity = answered_by(self.shape, self.base_url)
            # a served panel (its reward one of its terms): the terms named are asked of it
            self.required_rewards, self.asked = reward_terms(
                self.shape, required_rewards, self.weights
            )
        except BaseException:
            self._client.close()
            raise

    @classmethod
    def from_config(
        cls, config: RemoteBackendConfig, token: str | None = None
    ) -> RemoteRewardBackend:
        """The client a recipe (or the CLI) describes, every setting passed by its name (a setting
        added to both is settable from a recipe at once); `token` is the value of
        `config.token_env`."""
        if len(config.urls) != 1:
            raise TypeError("a config of several servers builds a MultiRemoteRewardBackend")
        keywords = settings(config, flatten=("client",), leave={*NOT_SETTINGS, "base_url"})
        return cls(config.urls[0], token, **keywords)

    def _exchange(
        self,
        what: str,
        call: Callable[[float], T],
        budget_s: float,
        cancel: Cancel | None = None,
    ) -> T:
        """`call(seconds_left)` until it succeeds, fails for good, tries run out, the next pause
        would reach the deadline `budget_s` after the first try began, or `cancel` is set (its
        exchange in flight ended at once)."""
        # this call's: a later interrupt() replaces it for later calls
        interrupted = self._interrupted
        if self._stopped.is_set():
            raise ScorerUnavailable(f"{what} at {self.base_url}: the backend is closed")
        scope: AbstractContextManager[object] = nullcontext() if cancel is None else cancel.scope()

        def go_on() -> bool:  # no retry behind the caller's back, nor of a send given up
            given_up = cancel is not None and cancel.is_set()
            return not (self._stopped.is_set() or interrupted.is_set() or given_up)

        def pause(seconds: float) -> None:
            if interrupted.wait(seconds) or self._stopped.is_set():
                raise ScorerUnavailable(
                    f"{what} at {self.base_url}: the backend was interrupted or closed"
                )

        retrying = Retry(
            time.monotonic() + budget_s,
            self.retry_backoff_s,
            self.retry_backoff_cap_s,
            retry_on=(TransportError, ErrorStatus),
            retry_if=retryable,
            max_tries=self.max_retries + 1,
            go_on=go_on,
            on_retry=lambda exc, tries, seconds: self._log_retry(what, exc, tries, seconds),
            sleep=pause,
        )
        try:
            with scope:
                return retrying.call(lambda: call(max(retrying.deadline - time.monotonic(), 0.001)))
        except (TransportError, ErrorStatus) as exc:
            tries = f"{retrying.tries} attempt{'s' if retrying.tries > 1 else ''}"
            raise scorer_error(exc, f"{what} at {self.base_url} after {tries}") from exc

    def _log_retry(self, what: str, exc: Exception, attempt: int, seconds: float) -> None:
        log.warning(
            "%s at %s: attempt %d failed (%s); retrying in %.2f s",
            what,
            self.base_url,
            attempt,
            exc,
            seconds,
        )

    def score_chunk(self, chunk: Sequence[RewardItem], group_size: int | None) -> ChunkAnswer:
        """One chunk of this backend's own call (it is its ChunkScorer), under a fresh key."""
        key = uuid.uuid4().hex  # the same on every try: a re-send is answered, not scored again
        return self.send_chunk(chunk, group_size, key, self._client.request_timeout)

    def send_chunk(
        self,
        chunk: Sequence[RewardItem],
        group_size: int | None,
        key: str,
        budget_s: float,
        cancel: Cancel | None = None,
    ) -> ChunkAnswer:
        """One chunk under idempotency key `key`, every try within `budget_s`, the answer verified
        against the chunk's ids (and the terms asked of a served panel). Public for a client over
        several servers: a chunk it re-sends to another server keeps its key and spends what is left
        of the same deadline; `cancel` gives a send up from another thread (its request closed, not
        retried), once another server answered it."""
        frame = encode_chunk(chunk, group_size, self.max_request_bytes, self.asked)
        answer = self._exchange(
            "score", lambda left: self._client.score(frame, key, left), budget_s, cancel
        )
        ids = [item.id for item in chunk]
        return verify_score_answer(
            answer, ids, self.required_rewards, declared=self.shape, asked=self.asked
        )

    def probe(self, timeout_s: float) -> dict[str, Any]:
        """/health, one try within `timeout_s`: for a client choosing among servers, one that does
        not answer at once is passed over for this call, not waited for."""
        if self._stopped.is_set():
            raise ScorerUnavailable(f"health at {self.base_url}: the backend is closed")
        try:
            return self._client.health(min(timeout_s, self._client.control_timeout))
        except (TransportError, ErrorStatus) as exc:
            raise scorer_error(exc, f"health at {self.base_url}") from exc

    def score(self, request: RewardRequest) -> Outcome:
        return score_in_chunks(request, self.plan(self.group_size), self)

    def plan(self, group_size: int | None) -> CallPlan:
        """How a call to this server is cut: `group_size` is the call's (a client over several
        servers sends each share with the size of the whole request)."""
        return CallPlan(
            self.shape,
            self.request_batch_size,
            self.required_rewards,
            self.weights,
            group_size,
            # a chunk waiting for a connection would spend its deadline there
            max_in_flight=MAX_CONNECTIONS,
            time_chunks=self.time_chunks,
        )

    @property
    def combination(self) -> dict[str, Any]:
        # a served panel's terms asked of it
        asked = {} if self.asked is None else {"asked": list(self.asked)}
        return {
            "required": list(self.required_rewards),
            "weights": dict(sorted(self.weights.items())),
            **asked,
        }

    @property
    def call_bound_s(self) -> float:
        return float(self._client.request_timeout)

    def health(self) -> dict[str, Any]:
        return self._exchange("health", self._client.health, self._client.control_timeout)

    def onload(self) -> dict[str, Any]:
        return self._exchange("onload", self._client.onload, self._client.request_timeout)

    def offload(self) -> dict[str, Any]:
        return self._exchange("offload", self._client.offload, self._client.request_timeout)

    def drain(self, timeout_s: float = 600.0) -> dict[str, Any]:
        # a later try waits for what is left of the first one's wait
        control = self._client.control_timeout
        return self._exchange(
            "drain",
            lambda left: self._client.drain(max(left - control, 0.01), left),
            timeout_s + control,
        )

    def interrupt(self) -> None:
        """Give up on the calls in flight (Ctrl-C, a cancelled coroutine): their connections are
        dropped (which ends a call waiting on one) and they are not retried. The backend stays
        usable: the next call opens new connections."""
        interrupted, self._interrupted = self._interrupted, threading.Event()
        interrupted.set()
        self._client.transport.reset()

    def close(self) -> None:
        """Closes connections only: the server belongs to whoever started it."""
        self._stop_submissions()
        self._stopped.set()
        self._interrupted.set()
        self._client.close()


def _check_settings(
    base_url: object,
    request_batch_size: int,
    max_answer_bytes: int,
    max_retries: int,
    retry_backoff_s: float,
    retry_backoff_cap_s: float,
) -> None:
    """TypeError or ValueError for settings no client can be built with, before any is opened."""
    if not isinstance(base_url, str):
        raise TypeError(
            "RemoteRewardBackend takes one URL (several of one scorer: MultiRemoteRewardBackend)"
        )
    if request_batch_size <= 0:
        raise ValueError("request_batch_size must be > 0")
    if max_answer_bytes < 1024:
        raise ValueError("max_answer_bytes must be >= 1024")
    if max_retries < 0 or not 0 < retry_backoff_s <= retry_backoff_cap_s:
        raise ValueError("need max_retries >= 0 and 0 < retry_backoff_s <= retry_backoff_cap_s")
