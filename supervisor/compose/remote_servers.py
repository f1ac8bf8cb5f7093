"""MultiRemoteRewardBackend: one term served by several `managed-scorers serve` servers of one
scorer.

Why: a scorer that waits (an LLM judge behind an API) or one server's GPU is the step's bottleneck;
OpenRLHF shards a batch across several reward URLs the same way. Each server is an ordinary
RemoteRewardBackend (its /health identity at construction, its retries and idempotency keys);
this class checks they all serve the same identity, splits a request by whole groups across the
servers that answer /health now (by their queue depth), sends the shares concurrently and joins
the answers by item id.

Failover: a chunk whose server fails for a reason another server could fix (unreachable,
connection lost, a 5xx that is not the scorer's own verdict) is re-sent once to another healthy
server, with the same idempotency key, within the call's one deadline. That is safe: the other
server never saw the key, so it scores the chunk once (and answers its own retries from its
cache); whatever the first server may have scored is never read; the answer is checked against
the chunk's ids as every answer is, and joined by id. A chunk that fails twice, or with nowhere
to go, raises its typed error naming the server(s).

Hedging: a chunk not answered within the delay (the p95 of recent sends, `compose.hedging`) is
sent once more to another healthy server, under the same key and the same deadline: safe for the
same reasons (the other server never saw the key; one of the two answers is read, checked like any
other). The first good answer wins; the other send is cancelled, its request closed, its answer
never read, its server not marked down for losing. A chunk goes to two servers at most: a hedge or
a failover, never both.

A server that fails its /health probe, or a chunk for a reason another server could fix, is passed
over by later calls without being asked (a stopped server would cost every call the probe's
timeout) until a probe in the background, one every `probe_interval_s`, finds it ready again.

Identity: every answer is checked against the identity all servers reported at construction (the
client's check, `ScorerClient`), before it is joined; a server restarted under another one fails
the call with `ScorerIdentityChanged`, never re-sent elsewhere: no call mixes two identities.
"""

from __future__ import annotations

import logging
import math
import queue
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from scorers.common.bounded_http import Cancel
from scorers.groups import share_groups
from supervisor.backend import RewardBackend
from supervisor.backends.remote import NOT_SETTINGS, RemoteRewardBackend, fixable_elsewhere
from supervisor.chunks import ChunkAnswer, request_group_size, request_groups, score_in_chunks
from supervisor.compose.hedging import HEDGES_SENT, HEDGES_WON, Attempt, Latencies, counted
from supervisor.composition import Component
from supervisor.config import RemoteBackendConfig, settings
from supervisor.errors import (
    ConfigError,
    ErrorStatus,
    ScorerError,
    ScorerIdentityChanged,
    ScorerTimeout,
    ScorerUnavailable,
    TransportError,
    prefixed,
)
from supervisor.fanout import on_each
from supervisor.joined import join_shares
from supervisor.outcome import Outcome, as_outcomes
from supervisor.shape import ScorerShape
from supervisor.types import RewardItem, RewardRequest

log = logging.getLogger(__name__)
RETARGET_S = 0.05  # a hedge that found no server free looks again after at least this
ENDED_GRACE_S = 5.0  # past the call's deadline, a chunk stops waiting for its sends to end


def same_identity(servers: Sequence[RemoteRewardBackend]) -> None:
    """Every server reports the first one's identity hash, or ConfigError naming both servers and
    hashes: servers of different scorer versions (revision, params) never mix rewards."""
    first = servers[0]
    for other in servers[1:]:
        if first.identity_hash is None or other.identity_hash != first.identity_hash:
            raise ConfigError(
                f"{other.base_url} serves {other.shape.name!r} revision "
                f"{other.shape.revision!r} identity {other.identity_hash}, but "
                f"{first.base_url} serves {first.shape.name!r} revision "
                f"{first.shape.revision!r} identity {first.identity_hash}: servers of "
                f"different scorer versions "
                "never mix rewards"
            )


def _queue_depth(health: Mapping[str, Any]) -> int | None:
    """Requests a server is scoring or holding (/health's `in_flight` and pending connections);
    None when it does not say."""
    in_flight = health.get("in_flight")
    connections = health.get("connections")
    pending = connections.get("pending", 0) if isinstance(connections, Mapping) else 0
    if (
        isinstance(in_flight, bool)
        or not isinstance(in_flight, int)
        or not isinstance(pending, int)
    ):
        return None
    return in_flight + pending


@dataclass(frozen=True)
class _ShareChunks:
    """The ChunkScorer of server `index`'s share of one call."""

    call: _Call
    index: int
    interrupt: Callable[[], None]

    def score_chunk(self, chunk: Sequence[RewardItem], group_size: int | None) -> ChunkAnswer:
        return self.call.score_chunk(self.index, chunk, group_size)


class _Call:
    """One call's servers: those that answered its /health, those that failed during it, those
    holding a chunk past its hedge delay, its deadline."""

    def __init__(
        self,
        servers: Sequence[RemoteRewardBackend],
        healthy: list[int],
        deadline: float,
        went_down: Callable[[int, str], None],
        latencies: Latencies | None,
    ) -> None:
        """`latencies`: the backend's, when chunks are hedged; None: they are not."""
        self.servers, self.healthy, self.deadline, self.went_down = (
            servers,
            healthy,
            deadline,
            went_down,
        )
        self.latencies = latencies
        self.failed: set[int] = set()
        # held a chunk past its delay, not answered since: no hedge goes there in this call
        self.lagging: set[int] = set()
        self.hedged_to: Counter[int] = Counter()  # hedges each server was sent in this call
        self.hedges_won = 0  # of this call's hedges, those answered first
        self._lock = threading.Lock()

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def score_chunk(
        self, index: int, chunk: Sequence[RewardItem], group_size: int | None
    ) -> ChunkAnswer:
        """A chunk of server `index`'s share: hedged to another server past the delay, or re-sent
        once elsewhere if that server fails; to two servers at most."""
        return _Race(self, chunk, group_size).run(index)

    def won_hedge(self) -> None:
        with self._lock:
            self.hedges_won += 1

    def hedges(self) -> dict[str, int]:
        """This call's hedges, as counts for its response's diagnostics (`HEDGES_SENT`, ...)."""
        with self._lock:
            return {HEDGES_SENT: sum(self.hedged_to.values()), HEDGES_WON: self.hedges_won}

    def hedge_target(self, index: int) -> int | None:
        """Where a chunk that server `index` holds past its delay goes too: a server that answered
        this call's /health, has failed nothing and holds nothing past its delay, the one sent the
        fewest hedges (then the next round the ring); None when there is none."""
        with self._lock:
            self.lagging.add(index)
            others = [i for i in self.healthy if i not in self.failed | self.lagging]
            if not others:
                return None
            count = len(self.servers)
            target = min(others, key=lambda i: (self.hedged_to[i], (i - index) % count))
            self.hedged_to[target] += 1
        return target

    def has_others(self, index: int) -> bool:
        """Whether another server of this call is still usable (answered its /health, failed
        nothing in it), lagging or not."""
        with self._lock:
            return any(i != index and i not in self.failed for i in self.healthy)

    def is_lagging(self, index: int) -> bool:
        with self._lock:
            return index in self.lagging

    def answered(self, index: int) -> None:
        with self._lock:
            self.lagging.discard(index)

    def failed_on(
        self, index: int, exc: ScorerError, chunk: Sequence[RewardItem], resend: bool
    ) -> int | None:
        """Server `index` failed a chunk: marked down if another server could fix it; where the
        chunk goes next when `resend` (None when not: a send in flight may still answer), or `exc`
        named and raised."""
        cause = exc.__cause__
        fixable = isinstance(cause, (TransportError, ErrorStatus)) and fixable_elsewhere(cause)
        with self._lock:
            if fixable:
                self.failed.add(index)
            others = [i for i in self.healthy if i not in self.failed and i != index]
        if fixable:
            self.went_down(index, str(exc).splitlines()[0])
        why = None
        if isinstance(exc, ScorerIdentityChanged):
            why = "an answer of another scorer identity: nothing more of that call is taken"
        elif not fixable:
            why = "not a fault of that server another one could fix"
        elif not resend:
            return None
        elif not others:
            why = "no other healthy server"
        elif self.left() <= 0.01:
            why = "the deadline is spent"
        if why is not None:
            raise prefixed(
                exc, f"{what_chunk(chunk)} on {self.servers[index].base_url}, not re-sent ({why})"
            ) from exc
        # the next one round the ring: failures spread, not piled
        later = [i for i in others if i > index]
        return (later or others)[0]


def what_chunk(chunk: Sequence[RewardItem]) -> str:
    return f"chunk of {len(chunk)} ids from {chunk[0].id!r}"


Sent = tuple[Attempt[ChunkAnswer], "ChunkAnswer | BaseException"]


class _Race:
    """One chunk's sends, under one idempotency key: the first, and at most one more (a hedge once
    the first has not answered within the delay, or a failover once it failed for a reason another
    server could fix). The first good answer wins; the other send is cancelled (its request closed,
    its answer never read), and its server is not marked down for losing."""

    def __init__(self, call: _Call, chunk: Sequence[RewardItem], group_size: int | None) -> None:
        self.call, self.chunk, self.group_size = call, chunk, group_size
        self.key = uuid.uuid4().hex  # travels with the chunk to a second server
        self.ended: queue.Queue[Sent] = queue.Queue()
        self.sent: list[Attempt[ChunkAnswer]] = []
        self.open: list[Attempt[ChunkAnswer]] = []  # sends whose outcome is not taken yet
        self.hedge_at = math.inf  # when the first send is hedged
        self.delay = math.inf  # after how long
        self.hedged = False
        self.deferred = False  # its hedge found no server free once, and looks again
        self.failure = ""  # the failed send's server and why, while the other may still answer

    def send(self, index: int) -> None:
        server, call = self.call.servers[index], self.call

        def send(cancel: Cancel) -> ChunkAnswer:
            return server.send_chunk(self.chunk, self.group_size, self.key, call.left(), cancel)

        attempt = Attempt(index, send, self.ended, f"remote-send-{index}")
        self.sent.append(attempt)
        self.open.append(attempt)

    def run(self, index: int) -> ChunkAnswer:
        self.send(index)
        if self.call.latencies is not None:
            # a server holding a chunk of this call past its delay is not waited for twice
            self.delay = 0.0 if self.call.is_lagging(index) else self.call.latencies.delay()
            self.hedge_at = self.sent[0].began + self.delay
        try:
            while True:
                taken = self._next()
                if taken is None:
                    continue
                attempt, outcome = taken
                self.open.remove(attempt)
                if isinstance(outcome, BaseException):
                    self._failed(attempt, outcome)
                else:
                    return self._won(attempt, outcome)
        finally:
            self._give_up_open()

    def _next(self) -> Sent | None:
        """The next send's outcome; None once the first send is hedged (or found nowhere to go),
        or a wait ended with nothing."""
        if len(self.sent) == 1 and time.monotonic() >= self.hedge_at:
            self.hedge_at = math.inf
            target = self.call.hedge_target(self.sent[0].index)
            if target is None and not self.call.has_others(self.sent[0].index):
                return None  # the call's only server left: nowhere to hedge to, ever
            if target is None:
                # every other server holds a chunk past its delay now (a burst of load): look again
                # once one may have answered, never give up on the hedge for the call
                self.hedge_at = time.monotonic() + max(self.delay, RETARGET_S)
                if not self.deferred and self.call.latencies is not None:
                    self.deferred = True
                    self.call.latencies.count_deferred()
            elif self.call.latencies is not None:
                self.call.latencies.count(won=False)
                self.hedged = True
                self.send(target)
            return None
        # each send ends by the call's deadline; past it and a grace, this wait does not go on
        end = self.call.deadline + ENDED_GRACE_S
        try:
            return self.ended.get(timeout=max(min(self.hedge_at, end) - time.monotonic(), 0.0))
        except queue.Empty:
            if time.monotonic() < end:
                return None
        urls = [self.call.servers[a.index].base_url for a in self.open]
        raise ScorerTimeout(
            f"{what_chunk(self.chunk)} sent to {urls}: no send ended {ENDED_GRACE_S:g} s past "
            "the call's deadline"
        )

    def _won(self, attempt: Attempt[ChunkAnswer], answer: ChunkAnswer) -> ChunkAnswer:
        latencies = self.call.latencies
        if latencies is not None:
            latencies.add(time.monotonic() - attempt.began)
            if self.hedged and attempt is self.sent[1]:
                latencies.count(won=True)
                self.call.won_hedge()
        self.call.answered(attempt.index)
        return answer

    def _failed(self, attempt: Attempt[ChunkAnswer], exc: BaseException) -> None:
        """A send failed: the other one waited for, a failover sent, or the chunk's error raised."""
        if not isinstance(exc, ScorerError):
            raise exc
        other = self.call.failed_on(attempt.index, exc, self.chunk, resend=len(self.sent) == 1)
        why = f"{self.call.servers[attempt.index].base_url} (which failed: {first_line(exc)})"
        if other is not None:
            self.failure = why
            self.send(other)
            return
        if self.open:  # the other send may still answer
            self.failure = why
            return
        if self.hedged:
            urls = " and ".join(self.call.servers[a.index].base_url for a in self.sent)
            raise prefixed(
                exc,
                f"{what_chunk(self.chunk)} hedged, sent to {urls}: both failed ({self.failure})",
            ) from exc
        raise prefixed(exc, f"{what_chunk(self.chunk)} re-sent once from {self.failure}") from exc

    def _give_up_open(self) -> None:
        """Cancel the sends still open; a first send hedged and given up counts as the delay it was
        hedged at (`compose.hedging`)."""
        for attempt in self.open:
            attempt.cancel()
            hedged_at = self.delay if self.hedged and attempt is self.sent[0] else 0.0
            if hedged_at > 0 and self.call.latencies is not None:  # 0: sent to a lagging server
                self.call.latencies.add(hedged_at)


def first_line(exc: BaseException) -> str:
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


class MultiRemoteRewardBackend(Component):
    """Several scorer servers of one identity as one backend; thread-safe. `options`: every option
    of RemoteRewardBackend (token, request_timeout, request_batch_size, pins, ...), the same for
    each."""

    def __init__(
        self,
        base_urls: Sequence[str],
        token: str | None = None,
        probe_timeout_s: float = 2.0,
        probe_interval_s: float = 1.0,
        hedge: bool = True,
        **options: Any,
    ) -> None:
        """`probe_timeout_s`: how long a call waits for a server's /health before passing it over;
        `probe_interval_s`: how often a server passed over is asked again, in the background;
        `hedge`: a chunk not answered within the p95 of recent chunks' latencies is sent once more
        to another server (`compose.hedging`)."""
        if probe_timeout_s <= 0 or probe_interval_s <= 0:
            raise ValueError("probe_timeout_s and probe_interval_s must be > 0")
        self.probe_timeout_s, self.probe_interval_s = probe_timeout_s, probe_interval_s
        urls = [base_urls] if isinstance(base_urls, str) else list(base_urls)
        if not urls or len(set(urls)) != len(urls):
            raise ValueError(f"base_urls must be distinct URLs, at least one: got {urls}")
        outcomes = on_each(
            urls, lambda url: RemoteRewardBackend(url, token, **options), "remote-connect"
        )
        built = [o for o in outcomes if isinstance(o, RemoteRewardBackend)]
        failed = [o for o in outcomes if isinstance(o, BaseException)]
        try:
            if failed:
                raise failed[0]  # each names its URL
            same_identity(built)
        except BaseException:
            for server in built:
                server.close()
            raise
        self.servers = built
        self.hedge = hedge
        self._latencies = Latencies(self.call_bound_s)
        self._stopped = threading.Event()
        self._standing_lock = threading.Lock()
        self._down: dict[int, str] = {}  # servers passed over without a probe, and why
        self._changed: dict[int, ScorerIdentityChanged] = {}  # what a background probe found
        self._watchers: dict[int, threading.Thread] = {}  # the background probe of each server down

    @classmethod
    def from_config(
        cls, config: RemoteBackendConfig, token: str | None = None
    ) -> MultiRemoteRewardBackend:
        """The servers a recipe (or the CLI) describes, every setting passed by its name: the probes
        here, the others to each server's client; `token` is the value of `config.token_env`."""
        probes = {"probe_timeout_s", "probe_interval_s", "hedge"}
        return cls(
            config.urls,
            token,
            **settings(config, flatten=("client",), leave={*NOT_SETTINGS, "base_url"} - probes),
        )

    @property
    def shape(self) -> ScorerShape:  # type: ignore[override]  # every server serves the same identity
        return self.servers[0].shape

    @property
    def group_size(self) -> int | None:  # type: ignore[override]
        return self.servers[0].group_size

    @property
    def required_rewards(self) -> list[str]:
        return self.servers[0].required_rewards

    @property
    def base_urls(self) -> list[str]:
        return [server.base_url for server in self.servers]

    @property
    def combination(self) -> dict[str, Any]:
        return self.servers[0].combination

    @property
    def call_bound_s(self) -> float:
        return self.servers[0].call_bound_s  # one deadline for a call, failover included

    def members(self) -> list[RewardBackend]:
        return list(self.servers)

    def stats(self) -> dict[str, Any]:
        """Counts since construction: `hedges_sent` (chunks sent once more past the delay),
        `hedges_won` (of those, answered first by the second server), `hedges_deferred` (chunks
        whose hedge found every other server lagging and looked again), `hedge_delay_s` (the delay
        now), `latency_samples` (in the window), `passed_over` (the URLs later calls skip)."""
        with self._standing_lock:
            down = sorted(self._down)
        return {
            **self._latencies.stats(),
            "passed_over": [self.servers[i].base_url for i in down],
        }

    def _healthy(self) -> tuple[list[int], list[int] | None]:
        """The servers that answer /health now with our identity, and each one's load in items (its
        queue depth in requests of request_batch_size), None if one does not report it. Servers down
        are not asked (their background probe is), unless no other answers: then they are."""
        with self._standing_lock:
            changed = next(iter(self._changed.values()), None)
            down = dict(self._down)
        if changed is not None:  # a new exception each call: the stored one keeps its own traceback
            raise prefixed(changed, "found by the background probe") from changed
        asked = [i for i in range(len(self.servers)) if i not in down]
        healthy, depths, failures = self._probe(asked)
        if not healthy and down:  # nowhere else to go: the servers down are worth the wait now
            healthy, depths, failures = self._probe(sorted(down))
        self._watch_down()
        if not healthy:
            why = [failures.get(i) or down.get(i, "?") for i in range(len(self.servers))]
            raise ScorerUnavailable(
                f"no server of {self.shape.name!r} is healthy: " + "; ".join(why)
            )
        counted = [d for d in depths if d is not None]
        size = self.servers[0].request_batch_size
        return healthy, [d * size for d in counted] if len(counted) == len(depths) else None

    def _probe(self, indexes: list[int]) -> tuple[list[int], list[int | None], dict[int, str]]:
        """/health of each server in `indexes` at once: those ready (marked up), their queue depths,
        and why each other one is not (marked down); another identity raises
        ScorerIdentityChanged."""
        if not indexes:
            return [], [], {}
        probe = self.probe_timeout_s
        outcomes = on_each(
            [self.servers[i] for i in indexes],
            lambda server: server.probe(probe),
            "remote-health",
            on_interrupt=self.interrupt,
        )
        healthy, depths, failures = [], [], {}
        for index, outcome in zip(indexes, outcomes, strict=True):
            why = self._verdict(index, outcome)
            if why is None:
                assert isinstance(outcome, Mapping)
                healthy.append(index)
                depths.append(_queue_depth(outcome))
            else:
                failures[index] = why
                self._went_down(index, why)
        return healthy, depths, failures

    def _verdict(self, index: int, outcome: Mapping[str, Any] | BaseException) -> str | None:
        """None when server `index`'s probe found it ready with our identity (it is marked up), else
        why not; another identity raises ScorerIdentityChanged, an error that is not a ScorerError
        is raised as it is."""
        url = self.servers[index].base_url
        if isinstance(outcome, ScorerError):
            return str(outcome).splitlines()[0]  # it names the URL
        if isinstance(outcome, BaseException):
            raise outcome
        named = outcome.get("identity_hash")
        if named != self.identity_hash:
            raise ScorerIdentityChanged(
                f"{url} now reports identity {named} (revision {outcome.get('revision')!r}), "
                f"not {self.identity_hash} "
                "as when this client was made: restarted with another scorer version or params?",
                url=url,
                expected=self.identity_hash,
                got=named if isinstance(named, str) else None,
            )
        if outcome.get("state") != "ready":
            return f"{url}: state {outcome.get('state')!r}"
        with self._standing_lock:
            self._down.pop(index, None)
            self._changed.pop(index, None)
        return None

    def _went_down(self, index: int, why: str) -> None:
        """Server `index` failed a probe or a chunk: later calls pass it over until it is ready
        again."""
        with self._standing_lock:
            if index not in self._down:
                log.warning(
                    "%s passed over until a probe finds it ready again: %s",
                    self.servers[index].base_url,
                    why,
                )
            self._down[index] = why
        self._watch_down()

    def _watch_down(self) -> None:
        """A background probe for every server down that has none alive in this process (a fork's
        copy of this backend has none of its parent's threads)."""
        with self._standing_lock:
            for index in self._down:
                watcher = self._watchers.get(index)
                if self._stopped.is_set() or (watcher is not None and watcher.is_alive()):
                    continue
                watcher = threading.Thread(
                    target=self._watch, args=(index,), name=f"remote-probe-{index}", daemon=True
                )
                self._watchers[index] = watcher
                watcher.start()

    def _watch(self, index: int) -> None:
        """Ask server `index` every probe_interval_s (one probe at a time) until it is ready again
        or the backend closes; one of another identity is what the next call raises."""
        server = self.servers[index]
        while not self._stopped.wait(self.probe_interval_s):
            with self._standing_lock:
                if index not in self._down:
                    return
            try:
                outcome: Mapping[str, Any] | BaseException = server.probe(self.probe_timeout_s)
            except ScorerError as exc:
                outcome = exc
            try:
                why = self._verdict(index, outcome)
            except ScorerIdentityChanged as exc:
                with self._standing_lock:
                    self._changed[index] = exc
                continue
            if why is None:
                log.warning("%s is ready again: calls use it", server.base_url)
                return
            with self._standing_lock:
                self._down[index] = why
                # the server of another identity is gone (stopped, say): passed over again, not an
                # error
                self._changed.pop(index, None)

    def score(self, request: RewardRequest) -> Outcome:
        if self._stopped.is_set():
            raise ScorerUnavailable(
                f"remote backend of {self.shape.name!r} at {self.base_urls} is closed"
            )
        deadline = time.monotonic() + self.call_bound_s
        group_size = request_group_size(request, self.group_size)
        groups = request_groups(request, self.shape, group_size)  # checked before anything is sent
        healthy, loads = self._healthy()
        shares = share_groups(groups, loads or [0] * len(healthy), least_loaded=loads is not None)
        call = _Call(
            self.servers,
            healthy,
            deadline,
            self._went_down,
            self._latencies if self.hedge else None,
        )
        sent = [(healthy[i], share) for i, share in enumerate(shares) if share]

        def score_share(target: tuple[int, list[int]]) -> Outcome:
            index, share = target
            part = RewardRequest(
                items=[request.items[p] for p in share], group_size=group_size, step=request.step
            )
            server = self.servers[index]
            return score_in_chunks(
                part, server.plan(group_size), _ShareChunks(call, index, self.interrupt)
            )

        outcomes = as_outcomes(
            on_each(sent, score_share, "remote-share", on_interrupt=self.interrupt)
        )

        # each names its server
        def named(_index: int, error: BaseException, others: int) -> BaseException:
            also = f"; {others} other share(s) failed too" if others else ""
            return prefixed(error, f"{self.shape.name!r} over {len(self.servers)} servers{also}")

        joined = join_shares(self.shape.name, request.ids, outcomes, named)
        if not self.hedge or joined.kind != "scored" or joined.response is None:
            return joined
        return Outcome.scored(counted(joined.response, self.shape.name, call.hedges()))

    # -- residency and lifecycle: every server ------------------------------------------------
    def _all(
        self, what: str, call: Callable[[RemoteRewardBackend], dict[str, Any]]
    ) -> dict[str, Any]:
        outcomes = on_each(self.servers, call, f"remote-{what}", on_interrupt=self.interrupt)
        for server, outcome in zip(self.servers, outcomes, strict=True):
            if isinstance(outcome, BaseException):
                raise prefixed(outcome, f"{what} of {server.base_url}") from outcome
        return {"servers": dict(zip(self.base_urls, outcomes, strict=True))}

    def health(self) -> dict[str, Any]:
        return self._all("health", lambda server: server.health())

    def onload(self) -> dict[str, Any]:
        return self._all("onload", lambda server: server.onload())

    def offload(self) -> dict[str, Any]:
        return self._all("offload", lambda server: server.offload())

    def drain(self) -> dict[str, Any]:
        return self._all("drain", lambda server: server.drain())

    def interrupt(self) -> None:
        for server in self.servers:
            server.interrupt()

    def close(self) -> None:
        """Closes connections only: the servers belong to whoever started them."""
        self._stop_submissions()
        self._stopped.set()
        for server in self.servers:
            server.close()
