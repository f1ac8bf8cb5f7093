"""RayPoolBackend: one scorer served by a pool of Ray actors placed by resources, used from any
process of a Ray cluster as one backend.

Why: a trainer already on Ray (verl, NeMo-RL, OpenRLHF) puts its reward workers on resources of
their own (GPUs, or nodes tagged with a custom resource such as `reward_node`). Each actor of the
pool owns one managed child (`ManagedScorerProcessBackend`) started from its own node's scorer
env; any driver or actor of the cluster addresses the actors as one `RewardBackend`. Ray places,
names and restarts the actors (`max_restarts`, `max_task_retries`: Ray's policy, not one of
ours); this module splits a request by whole groups, hands each share to an actor through the
object store (`ray.put` of the share once, the actor reads its arrays from there without a
pickled copy per call) and joins the answers by id.

Deadline: a share not answered by the call's deadline is cancelled (`ray.cancel`): one Ray had
not handed over yet never runs; the actor stops one it holds where it is (queued behind another
share: it leaves the queue; scoring: its child is killed and the next share starts a new one),
and says which. A hung share so costs one failed call, never the calls queued behind it.

Identity: every actor's answer is signed with the identity of the child that produced it, and
where that runs; the pool joins nothing of an answer whose identity is not the pool's (an actor
Ray restarted on a node whose scorer env changed): `PoolIdentityChanged`.

Lifetime: `RayPoolBackend.create` starts the named actors `<name>.<index>` in `namespace` and
owns them: its `close()`, or `kill()` by anyone, ends them, and their children with them (a
child's lifeline watches its actor process, however that dies). With `lifetime: job` (the
default) Ray also ends them with the driver that created them; `detached` keeps them until
killed or the cluster stops. `RayPoolBackend.connect(name)`, from any other process, uses them
and never ends them. Ray is imported on first use: nothing here needs it at import time.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from scorers.groups import share_groups
from supervisor.backends.managed import ManagedScorerProcessBackend
from supervisor.chunks import request_group_size, request_groups
from supervisor.compose.hedging import Latencies, counted
from supervisor.compose.pool_race import race
from supervisor.composition import Component
from supervisor.errors import (
    ConfigError,
    PoolActorDied,
    PoolIdentityChanged,
    RewardContractError,
    ScorerError,
    ScorerStartupError,
    ScorerTimeout,
    ScorerUnavailable,
    prefixed,
)
from supervisor.joined import join_shares
from supervisor.outcome import Outcome
from supervisor.shape import ScorerShape
from supervisor.types import RewardRequest

log = logging.getLogger(__name__)
# Threads of one actor: a second driver's call, or `info`, is taken while another call scores (the
# managed backend scores one call at a time anyway, so a deadline still measures service time).
ACTOR_THREADS = 4
CLOSE_TIMEOUT_S = 30.0  # the actors' graceful close (their children's shutdown), then ray.kill
CANCEL_POLL_S = 0.05  # how often a share waiting in its actor looks for its cancel
# a scoring share, its child killed at its cancel, ends within this (the exchange breaks)
KILLED_SHARE_S = 3.0
# the actor's answer to a cancel (queued or scoring) comes back within this after the call's
# deadline
CANCEL_GRACE_S = KILLED_SHARE_S + 2.0
RESTART_POLL_S = 0.2  # how often an actor Ray is restarting is asked again for its info
WITHDRAWN_KEPT_S = 3600.0  # a withdrawn share's key, for a share that comes after its withdraw


class RayPoolConfig(BaseModel):
    """Where the pool's actors go, how Ray restarts them, and the scorer each one runs."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_-]+$")
    namespace: str = "managed-scorers"
    actors: int = Field(default=2, ge=1)
    num_cpus: float = Field(default=1.0, ge=0)
    num_gpus: float = Field(default=0.0, ge=0)
    resources: dict[str, float] = Field(default_factory=dict)  # e.g. {"reward_node": 1}
    lifetime: Literal["job", "detached"] = "job"
    max_restarts: int = Field(default=3, ge=-1)  # Ray's: -1 restarts for ever
    # Ray's: a share in flight when its actor died is run again on the restarted actor. 0 (the
    # default): the trainer gets PoolActorDied, never a call re-sent behind its back.
    max_task_retries: int = Field(default=0, ge=-1)
    start_timeout_s: float = Field(default=300.0, gt=0)
    call_timeout_s: float = Field(default=600.0, gt=0)
    # a share not answered within the p95 of recent shares is sent once more to another actor
    # (compose.pool_race); off: each share waits for its own actor
    hedge: bool = True
    scorer: dict[str, Any]  # a ManagedScorerProcessSpec, read on each actor's node (its envs)


def actor_name(pool: str, index: int) -> str:
    return f"{pool}.{index}"


def _ray() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise ConfigError(
            f"a Ray reward pool needs Ray here: pip install 'managed-scorers[ray]' ({exc})"
        ) from exc
    if not ray.is_initialized():
        raise ConfigError(
            "a Ray reward pool is used from a Ray driver or actor: call ray.init(address=...) first"
        )
    return ray


@dataclass(frozen=True)
class ShareAnswer:
    """An actor's answer to one share, signed by what produced it: the identity of the child that
    scored it and where the actor runs now. The pool checks the identity before it joins anything.
    A share stopped at its cancel is raised instead (it carries no reward)."""

    outcome: Outcome
    identity_hash: str | None
    where: dict[str, Any]  # node_id, node_ip, pid, child_pid


class PoolActor:
    """One actor of the pool: its managed child runs from this node's scorer env and dies with it.

    Shares score one at a time, in the order they came; the others wait in `_turns`, where the
    pool's cancel (its call's deadline) reaches them: the actor owns the child, so the actor is
    where a share past its deadline is stopped."""

    def __init__(
        self, scorer: Mapping[str, Any], index: int, count: int, policy: Mapping[str, int]
    ) -> None:
        self.index, self.count, self.policy = index, count, dict(policy)
        self.backend = ManagedScorerProcessBackend(scorer)
        self._turns = ThreadPoolExecutor(max_workers=1, thread_name_prefix="share")
        self._held = 0  # shares queued or scoring here
        self._held_lock = threading.Lock()
        self._scoring: object | None = None  # the token of the share scoring now
        self._scoring_lock = threading.Lock()
        self._shares: dict[str, Future[Outcome]] = {}  # a hedged share's turn, by its key
        self._withdrawn: dict[str, float] = {}  # keys withdrawn, when: kept `WITHDRAWN_KEPT_S`

    def where(self) -> dict[str, Any]:
        import ray

        return {
            "node_id": ray.get_runtime_context().get_node_id(),
            "node_ip": ray.util.get_node_ip_address(),
            "pid": os.getpid(),
            "child_pid": self.backend.pid,
        }

    def info(self) -> dict[str, Any]:
        """Where this actor is and what it serves: the driver names it in errors with this."""
        return {
            "index": self.index,
            "count": self.count,
            "policy": self.policy,
            **self.where(),
            "shape": self.backend.shape,
            "group_size": self.backend.group_size,
            "combination": self.backend.combination,
        }

    def score(
        self, request: RewardRequest, key: str | None = None, left_s: float | None = None
    ) -> ShareAnswer:
        """The share's rewards, or its typed error, signed; waits its turn, and stops where it is
        when the pool cancels it (`ray.cancel` at the call's deadline). `key`: the share's name
        for `withdraw`, when the pool may hedge it; a withdrawn share the pool no longer waits
        for is stopped here once the call's `left_s` have passed, as the pool's cancel would."""
        import ray

        context = ray.get_runtime_context()
        share = (
            f"its share of {len(request.items)} ids from {request.items[0].id!r}"
            if request.items
            else "its share"
        )
        began: list[float] = []
        until = time.monotonic() + (left_s if left_s is not None else float("inf"))
        with self._held_lock:
            if key is not None and key in self._withdrawn:  # withdrawn before it came
                raise ScorerTimeout(f"{share} was withdrawn before it began: answered elsewhere")
            ahead, self._held = self._held, self._held + 1

        def scoring() -> Outcome:
            with self._scoring_lock:
                self._scoring = turn_token
            began.append(time.monotonic())
            try:
                return self.backend.score(request)
            finally:
                with self._scoring_lock:
                    self._scoring = None

        turn_token = object()

        turn = self._turns.submit(scoring)
        if key is not None:
            with self._held_lock:
                self._shares[key] = turn
        turn.add_done_callback(lambda done: self._released(key, done))
        while not wait([turn], timeout=CANCEL_POLL_S).done:
            # raised: Ray answers a cancelled task's return with TaskCancelledError
            late = key in self._withdrawn and time.monotonic() > until
            if context.is_canceled() or late:
                raise self._stopped(turn, turn_token, share, ahead, began)
        if turn.cancelled():
            raise ScorerTimeout(f"{share} was withdrawn before it began: answered elsewhere")
        return self._signed(self._answer(turn))

    def withdraw(self, key: str) -> str:
        """A hedged share another actor answered first: out of the queue if it has not begun
        ("dropped"); left to finish if it is scoring ("scoring"), stopped only at its call's
        deadline (`score`): a hedge alone never costs a child. "gone": it had ended, or has not
        come yet (it is then refused when it comes)."""
        now = time.monotonic()
        with self._held_lock:
            self._withdrawn[key] = now
            for old, when in list(self._withdrawn.items()):
                if now - when > WITHDRAWN_KEPT_S:
                    del self._withdrawn[old]
            turn = self._shares.get(key)
        if turn is None:
            return "gone"
        return "dropped" if turn.cancel() else "scoring"

    def _released(self, key: str | None, _turn: Future[Outcome]) -> None:
        with self._held_lock:
            self._held -= 1
            if key is not None:
                self._shares.pop(key, None)

    def _answer(self, turn: Future[Outcome]) -> Outcome:
        error = turn.exception()
        if error is None:
            return turn.result()
        if isinstance(error, ScorerError):
            return Outcome.raised(error)
        raise error  # not ours: Ray hands it to the pool as a RayTaskError

    def _stopped(
        self, turn: Future[Outcome], token: object, share: str, ahead: int, began: list[float]
    ) -> ScorerTimeout:
        """The share's call passed its deadline. Queued: it leaves the queue, never scored. Scoring:
        its child is killed (the next share starts a new one, counted against the restart policy),
        so nothing queues behind a hang. The kill happens only while this share is the one scoring:
        a share that ended meanwhile never costs the next one its child."""
        if turn.cancel():
            return ScorerTimeout(
                f"{share} was still queued when the call's deadline passed (it came behind "
                f"{ahead} other "
                "share(s) of this actor): cancelled, never scored"
            )
        # the turn left the queue: it is starting or has ended
        started_by = time.monotonic() + KILLED_SHARE_S
        while self._scoring is not token and not turn.done() and time.monotonic() < started_by:
            time.sleep(CANCEL_POLL_S / 5)
        with self._scoring_lock:
            if self._scoring is not token:
                return ScorerTimeout(
                    f"{share} ended just as the call's deadline passed: its answer came too late"
                )
            child = self.backend.pid
            self.backend.kill_late_call()  # kills the child serving the share
            self.backend.abort_start()  # or the one a restart is booting for it
        try:
            turn.exception(timeout=KILLED_SHARE_S)
            ended = "ended"
        except TimeoutError:
            ended = f"has not ended {KILLED_SHARE_S} s after that (shares behind it wait)"
        scored_s = time.monotonic() - began[0] if began else 0.0
        return ScorerTimeout(
            f"{share} was scoring ({scored_s:.1f} s) when the call's deadline passed: its "
            f"child (pid {child}) was killed and the share {ended}; the next share starts a "
            f"new child"
        )

    def _signed(self, outcome: Outcome) -> ShareAnswer:
        return ShareAnswer(outcome, self.backend.identity_hash, self.where())

    def close(self) -> None:
        self._turns.shutdown(wait=False, cancel_futures=True)
        self.backend.close()


@functools.cache
def _actor_class() -> Any:
    return _ray().remote(PoolActor)


def _placement(config: RayPoolConfig) -> dict[str, Any]:
    """The actor options Ray places and restarts an actor by."""
    return {
        "namespace": config.namespace,
        "lifetime": "detached" if config.lifetime == "detached" else None,
        "num_cpus": config.num_cpus,
        "num_gpus": config.num_gpus,
        "resources": dict(config.resources),
        "max_restarts": config.max_restarts,
        "max_task_retries": config.max_task_retries,
        "max_concurrency": ACTOR_THREADS,
    }


@dataclass
class _Member:
    index: int
    handle: Any
    # None: not known yet, or its actor died (Ray may restart it)
    info: dict[str, Any] | None = None
    last: dict[str, Any] | None = None  # the last info known: what an error names while it restarts


class RayPoolBackend(Component):
    """The pool's actors as one backend; thread-safe, usable from any process of the cluster."""

    def __init__(
        self,
        config: RayPoolConfig | None,
        name: str,
        namespace: str,
        handles: Sequence[Any],
        owned: bool,
    ) -> None:
        """Use `create` or `connect`."""
        self.config, self.name, self.namespace, self.owned = config, name, namespace, owned
        self._pool = [_Member(index, handle) for index, handle in enumerate(handles)]
        self.call_timeout_s = config.call_timeout_s if config is not None else 600.0
        self._lock = threading.Lock()
        self._closed = False
        self.shape: ScorerShape = ScorerShape(name, ())
        self._latencies = Latencies(self.call_timeout_s)  # the hedge delay: recent shares' p95
        self.hedge = config.hedge if config is not None else True

    @classmethod
    def create(cls, config: RayPoolConfig | Mapping[str, Any]) -> RayPoolBackend:
        """Start the pool's named actors (each boots its child) and wait until every one serves; if
        one cannot, the pool is killed and the error names it."""
        config = (
            config if isinstance(config, RayPoolConfig) else RayPoolConfig.model_validate(config)
        )
        remote = _actor_class()
        policy = {"max_restarts": config.max_restarts, "max_task_retries": config.max_task_retries}
        pool = cls(config, config.name, config.namespace, [], owned=True)
        try:
            for index in range(config.actors):
                name = actor_name(config.name, index)
                try:
                    handle = remote.options(name=name, **_placement(config)).remote(
                        dict(config.scorer), index, config.actors, policy
                    )
                except ValueError as exc:  # Ray: the name is taken in this namespace
                    raise ConfigError(
                        f"cannot create Ray pool {config.name!r} in namespace "
                        f"{config.namespace!r} ({exc}): "
                        "connect to it (RayPoolBackend.connect) or kill it first"
                    ) from exc
                pool._pool.append(_Member(index, handle))
            pool._learn(config.start_timeout_s)
        except BaseException:
            pool.kill()
            raise
        return pool

    @classmethod
    def connect(
        cls,
        name: str,
        namespace: str = "managed-scorers",
        timeout_s: float = 300.0,
        call_timeout_s: float = 600.0,
        hedge: bool = True,
    ) -> RayPoolBackend:
        """The pool another process created, by name; this backend never ends its actors."""
        ray = _ray()
        try:
            first = ray.get_actor(actor_name(name, 0), namespace=namespace)
        except ValueError as exc:
            raise ConfigError(
                f"no Ray reward pool {name!r} in namespace {namespace!r}: {exc}"
            ) from exc
        pool = cls(None, name, namespace, [first], owned=False)
        pool.call_timeout_s = call_timeout_s
        pool._latencies, pool.hedge = Latencies(call_timeout_s), hedge
        count = pool._infos(time.monotonic() + timeout_s, "connect")[0]["count"]
        handles = [
            first,
            *(ray.get_actor(actor_name(name, i), namespace=namespace) for i in range(1, count)),
        ]
        pool._pool = [_Member(index, handle) for index, handle in enumerate(handles)]
        pool._learn(timeout_s)
        return pool

    # -- what the actors are ----------------------------------------------------------------
    def _learn(self, timeout_s: float) -> None:
        """Every actor's info; they must all serve the same scorer (one identity hash), whatever
        their node's env holds: rewards of different scorer versions never mix."""
        infos = self._infos(time.monotonic() + timeout_s, "start")
        hashes = {info["shape"].identity_hash for info in infos}
        if len(hashes) > 1:
            found = ", ".join(
                f"{self.describe(m)}: {m.info['shape'].identity_hash}" for m in self._pool if m.info
            )
            raise ConfigError(
                f"Ray pool {self.name!r}: its actors serve different scorers ({found})"
            )
        self.shape = infos[0]["shape"]
        self.group_size = infos[0]["group_size"]
        self._combination = infos[0]["combination"]

    def _infos(self, deadline: float, what: str) -> list[dict[str, Any]]:
        """Each member's info, asked again where it is not known; an actor Ray is restarting (whose
        calls Ray fails meanwhile) is asked again until it answers or `deadline` passes."""
        restarting = _ray().exceptions.ActorUnavailableError
        missing = [m for m in self._pool if m.info is None]
        while missing:
            refs = [m.handle.info.remote() for m in missing]
            outcomes = self._outcomes(missing, refs, deadline, what, keep=(restarting,))
            again = []
            for member, outcome in zip(missing, outcomes, strict=True):
                if isinstance(outcome, restarting):
                    if time.monotonic() + RESTART_POLL_S < deadline:
                        again.append(member)
                        continue
                    outcome = self._translated(outcome, member, what)
                if isinstance(outcome, BaseException):
                    raise outcome
                member.info = member.last = outcome
            missing = again
            if missing:
                time.sleep(RESTART_POLL_S)
        return [m.info for m in self._pool if m.info is not None]

    def actors(self, timeout_s: float = 300.0) -> list[dict[str, Any]]:
        """Where each actor runs now (node id and ip, actor and child pids), asked again after a
        death."""
        return self._infos(time.monotonic() + timeout_s, "info")

    def describe(self, member: _Member) -> str:
        info = member.info or member.last or {}
        where = (
            f"node {info['node_id']} ({info['node_ip']}), pid {info['pid']}"
            if info
            else "not reached yet"
        )
        return f"Ray pool {self.name!r} actor {member.index}/{len(self._pool)} ({where})"

    @property
    def combination(self) -> dict[str, Any] | None:
        return getattr(self, "_combination", None)

    @property
    def call_bound_s(self) -> float:
        """The call's deadline, then the actors' answers to the cancel of what was late."""
        return self.call_timeout_s + CANCEL_GRACE_S

    # -- scoring ---------------------------------------------------------------------------
    def score(self, request: RewardRequest) -> Outcome:
        """Whole groups to each actor, each share put once in the object store, all sent at once;
        one deadline for the whole call, past which unanswered shares are cancelled. A failed share
        fails the call with its own typed error; an answer of another identity fails it first."""
        if self._closed:
            raise ScorerUnavailable(f"Ray pool {self.name!r} backend is closed")
        ray = _ray()
        group_size = request_group_size(request, self.group_size)
        groups = request_groups(request, self.shape, group_size)
        shares = share_groups(groups, [0] * len(self._pool), False)
        deadline = time.monotonic() + self.call_timeout_s
        # an actor that died: wait for Ray's restart
        self._infos(deadline, "coming back after a restart")
        sent = []
        for member, share in zip(self._pool, shares, strict=True):
            if not share:
                continue
            part = RewardRequest(
                items=[request.items[p] for p in share], group_size=group_size, step=request.step
            )
            ids = [request.items[p].id for p in share]
            what = f"scoring its share of {len(share)} ids from {ids[0]!r}"
            # put once: the actor (and a hedge's) reads its arrays from the store
            sent.append((member, ray.put(part), ids, what))
        latencies = self._latencies if self.hedge else None
        outcomes, hedges = race(ray, self, sent, latencies, deadline)
        for outcome in outcomes:
            if isinstance(outcome.error, PoolIdentityChanged):
                return outcome  # nothing of another identity is joined, not even a partial
        joined = join_shares(
            self.shape.name, request.ids, outcomes, lambda _index, error, _others: error
        )
        if joined.kind != "scored" or joined.response is None or latencies is None:
            return joined
        return Outcome.scored(counted(joined.response, self.shape.name, hedges))

    def _accepted(self, member: _Member, answer: Any, ids: list[str]) -> Outcome:
        """A share's outcome once its signature is checked: the pool's identity, and its own ids."""
        if not isinstance(answer, ShareAnswer):
            return Outcome.raised(answer)  # a Ray failure, already translated
        # what errors name: the actor as it answered
        member.last = {**(member.last or {}), **answer.where}
        if member.info is not None:
            member.info = {**member.info, **answer.where}
        where = self.describe(member)
        if answer.identity_hash != self.shape.identity_hash:
            return Outcome.raised(
                PoolIdentityChanged(
                    f"{where} answered from child pid {answer.where.get('child_pid')} of "
                    f"scorer identity {answer.identity_hash}, not the pool's "
                    f"{self.shape.identity_hash}: Ray restarted or replaced the "
                    "actor, and its node's scorer env now serves another revision or params; "
                    "refused (fix that env, or create the pool anew)",
                    actor=actor_name(self.name, member.index),
                    node_id=answer.where.get("node_id"),
                    node_ip=answer.where.get("node_ip"),
                    actor_pid=answer.where.get("pid"),
                    expected=self.shape.identity_hash,
                    got=answer.identity_hash,
                )
            )
        outcome = answer.outcome
        if outcome.kind == "failed" and outcome.error is not None:
            return Outcome.raised(prefixed(outcome.error, where))
        if (
            outcome.kind == "scored"
            and outcome.response is not None
            and outcome.response.ids != ids
        ):
            return Outcome.raised(
                RewardContractError(
                    f"{where} answered for ids {outcome.response.ids[:4]}... where its share "
                    f"was {ids[:4]}..."
                )
            )
        return outcome

    def _outcomes(
        self,
        members: Sequence[_Member],
        refs: Sequence[Any],
        deadline: float,
        what: str | Sequence[str],
        keep: tuple[type[Exception], ...] = (),
    ) -> list[Any]:
        """Each ref's value, or its failure as this project's typed error (those of `keep`: as Ray
        raised them). At `deadline` every call not answered is cancelled, and its actor's answer to
        the cancel waited for `CANCEL_GRACE_S` more. `what`: what each call was doing (one for all,
        or one per call), for the error."""
        ray = _ray()
        whats = [what] * len(refs) if isinstance(what, str) else list(what)
        late: list[Any] = []
        if refs:
            _, late = ray.wait(
                list(refs), num_returns=len(refs), timeout=max(0.0, deadline - time.monotonic())
            )
        for ref in late:
            # not handed over yet: never runs; held by the actor: it stops it (PoolActor.score)
            ray.cancel(ref)
        grace = time.monotonic() + CANCEL_GRACE_S
        outcomes: list[Any] = []
        for member, ref, doing in zip(members, refs, whats, strict=True):
            try:
                outcomes.append(ray.get(ref, timeout=max(0.0, grace - time.monotonic())))
            except Exception as exc:  # noqa: BLE001 - translated here, raised or joined by the caller
                outcomes.append(
                    exc if isinstance(exc, keep) else self._translated(exc, member, doing)
                )
        return outcomes

    def _translated(self, exc: Exception, member: _Member, what: str) -> Exception:
        """The one place a Ray failure becomes this project's error, naming the actor, node and
        pid."""
        errors = _ray().exceptions
        where = self.describe(member)
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if isinstance(exc, errors.RayActorError):
            # asked again next time: Ray may restart it elsewhere
            info, member.info = member.last or {}, None
            if exc.actor_init_failed:
                return ScorerStartupError(f"{where}: the actor could not start its scorer: {exc}")
            policy = info.get("policy", {})
            return PoolActorDied(
                f"{where} died while {what} ({type(exc).__name__}: {first}); Ray restarts it "
                f"while its max_restarts ({policy.get('max_restarts', '?')}) allow, and this "
                f"share was "
                f"{'re-sent by Ray up to max_task_retries times' if policy.get('max_task_retries') else 'not re-sent'}",  # noqa: E501
                actor=actor_name(self.name, member.index),
                node_id=info.get("node_id"),
                node_ip=info.get("node_ip"),
                actor_pid=info.get("pid"),
            )
        # cancelled at the deadline before the actor took it up
        if isinstance(exc, errors.TaskCancelledError):
            return ScorerTimeout(
                f"{where}: {what}: still queued for the actor in Ray when the call's "
                f"{self.call_timeout_s} s "
                "deadline passed: cancelled, never scored"
            )
        if isinstance(exc, errors.GetTimeoutError):
            return ScorerTimeout(
                f"{where}: no answer while {what} within the call's {self.call_timeout_s} s "
                f"deadline, nor to its cancel {CANCEL_GRACE_S} s after it: the actor is not "
                f"answering (stopped, stuck, or its node "
                "unreachable), so whether the share was queued or scoring is unknown"
            )
        # raised inside the actor, not by its scorer: named
        if isinstance(exc, errors.RayTaskError):
            cause = exc.cause
            if isinstance(cause, ScorerError):
                return prefixed(cause, where)  # type: ignore[return-value]  # a ScorerError stays one
            return ScorerError(f"{where}: {what} raised {type(cause).__name__}: {cause}")
        if isinstance(exc, errors.RayError):  # an object lost, an owner gone, a node lost
            return ScorerUnavailable(
                f"{where}: Ray failed while {what}: {type(exc).__name__}: {first}"
            )
        return exc

    # -- lifecycle -------------------------------------------------------------------------
    def kill(self) -> None:
        """End every actor now (SIGKILL; no restart); their children go with them. Any process
        may."""
        ray = _ray()
        self._closed = True
        for member in self._pool:
            ray.kill(member.handle, no_restart=True)

    def close(self) -> None:
        """A pool this backend created: each actor closes its child (bounded), then the actors are
        killed. A connected one only stops using the pool."""
        self._stop_submissions()
        with self._lock:
            first, self._closed = not self._closed, True
        if not first or not self.owned:
            return
        ray = _ray()
        refs = [m.handle.close.remote() for m in self._pool]
        for member, outcome in zip(
            self._pool,
            self._outcomes(self._pool, refs, time.monotonic() + CLOSE_TIMEOUT_S, "closing"),
            strict=True,
        ):
            if isinstance(outcome, BaseException):
                log.warning(
                    "%s: its child's graceful close failed (%s); killing the actor",
                    self.describe(member),
                    outcome,
                )
        for member in self._pool:
            ray.kill(member.handle, no_restart=True)
