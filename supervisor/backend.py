"""The one interface a trainer calls, whatever runs the scorer."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, NamedTuple, Self

import numpy as np

from scorers.common.retry import Retry
from scorers.diagnostics import merge_reports, report
from scorers.groups import GroupInputError, pack_chunks, partition
from supervisor.arena import Arena, HeapArena
from supervisor.errors import (
    ConfigError,
    RewardContractError,
    ScorerRequestError,
    ScorerTermsFailed,
    ScorerUnavailable,
)
from supervisor.fanout import on_each
from supervisor.joined import items_failed
from supervisor.stream import RewardStream
from supervisor.submit import DEFAULT_MAX_PENDING, Submission, SubmissionQueueFull, Submitter
from supervisor.types import SCORER_TERM_FAILED, RewardItem, RewardRequest, RewardResponse

_SUBMITTER_LOCK = threading.Lock()


def _fresh_submitter_lock() -> None:
    """A fork may happen while another thread holds the lock: the child gets a free one."""
    global _SUBMITTER_LOCK
    _SUBMITTER_LOCK = threading.Lock()


os.register_at_fork(after_in_child=_fresh_submitter_lock)


class ChunkAnswer(NamedTuple):
    """What one exchange with the scorer answers, whatever runs it."""

    terms: Mapping[str, np.ndarray]
    diagnostics: Mapping[str, Any]
    failed: Mapping[str, str]  # ids the scorer could not score -> why
    term_failed: Mapping[str, Mapping[str, str]]  # per term, the ids that term alone failed for -> why
    not_applicable: Mapping[str, frozenset[str]] = MappingProxyType({})  # per term, the ids it does not apply to


ChunkScorer = Callable[[Sequence[RewardItem], int | None], ChunkAnswer]


@dataclass(frozen=True)
class ScorerShape:
    """What a backend knows of its scorer before it cuts a request into chunks."""

    name: str
    terms: tuple[str, ...]
    groupwise: bool = False
    ragged_groups: bool = False
    identity_hash: str | None = None
    revision: str | None = None
    diagnostics: tuple[str, ...] = ()
    required_fields: tuple[str, ...] = ()  # what it reads of an item (what a group rebuilt across ranks carries)
    concurrent_calls: int = 1  # chunks of one request it takes at once (see ScorerSpec.concurrent_calls)
    reward_term: str | None = None  # the term that is its reward by itself (a served panel, see reward_terms)

    @classmethod
    def from_entry(cls, entry: Any, where: str = "the scorer") -> ScorerShape:
        """From a child's readiness line or a server's /health (`ScorerHost.catalog_entry`); one that
        does not say what it serves is a RewardContractError naming `where` (not a scorer server)."""
        terms = entry.get("terms") if isinstance(entry, Mapping) else None
        calls = entry.get("concurrent_calls", 1) if isinstance(entry, Mapping) else None
        if (
            not isinstance(entry, Mapping)
            or not isinstance(entry.get("scorer"), str)
            or not isinstance(terms, list)
            or not all(isinstance(term, str) for term in terms)
            or isinstance(calls, bool)
            or not isinstance(calls, int)
        ):
            fields = sorted(entry)[:12] if isinstance(entry, Mapping) else type(entry).__name__
            raise RewardContractError(
                f"{where} does not say what it serves (a 'scorer' name, its 'terms', an int 'concurrent_calls'; "
                f"got {fields}): is it a managed-scorers server?"
            )
        return cls(
            name=str(entry["scorer"]),
            terms=tuple(entry["terms"]),
            groupwise=bool(entry.get("groupwise", False)),
            ragged_groups=bool(entry.get("ragged_groups", False)),
            identity_hash=entry.get("identity_hash"),
            revision=entry.get("revision"),
            diagnostics=tuple(entry.get("diagnostics", ())),
            required_fields=tuple(entry.get("required_fields", ())),
            concurrent_calls=max(1, calls),
            reward_term=entry.get("reward_term") if isinstance(entry.get("reward_term"), str) else None,
        )


class RewardBackend(ABC):
    """`compute_rewards` (and `submit`, its non-blocking form) plus residency and lifecycle;
    usable as a context manager."""

    shape: ScorerShape | None = None  # the scorer behind it, once known (None for a panel)
    group_size: int | None = None  # configured: every group of every request must have this size
    max_pending: int = DEFAULT_MAX_PENDING  # submissions that may wait (see supervisor.submit)
    max_queue_wait_s: float = 600.0  # how long compute_rewards_async waits for room in that queue
    _submitter: Submitter | None = None
    _submissions_closed = False

    def submit(self, request: RewardRequest) -> Future[RewardResponse]:
        """Queue `request` and return at once; the future holds its response or its typed error.
        Requests are sent one at a time, in order: each one's deadline is its own service time."""
        self._check_owner()  # in a fork: raise here, not later on the future
        with _SUBMITTER_LOCK:
            if self._submissions_closed:
                raise ScorerUnavailable(f"{type(self).__name__} is closed: nothing more can be submitted")
            if self._submitter is None or not self._submitter.owned_here():
                # none yet, or a fork's copy of its parent's (whose worker thread did not fork with it):
                # a backend any process may use gets a submitter of this process's own
                self._submitter = Submitter(
                    self.compute_rewards, type(self).__name__, self.max_pending, interrupt=self.interrupt
                )
            submitter = self._submitter
        return submitter.submit(request)

    def stream(self, group_size: int | None = None, **options: Any) -> RewardStream:
        """Score items as they finish (see supervisor.stream): `add` them one by one or in runs,
        collect the step's rewards at `results()`. Options: window, max_wait_s, max_pending,
        max_block_s, collect."""
        return RewardStream(self, group_size, **options)

    async def compute_rewards_async(self, request: RewardRequest) -> RewardResponse:
        """`compute_rewards` for a coroutine: the event loop is free while the request is scored.

        When `max_pending` submissions already wait, the coroutine waits for room (up to
        `max_queue_wait_s`) instead of failing: a loop of per-item tasks (verl's) is
        backpressure, not an error. `submit()` itself never waits."""
        room = Retry(time.monotonic() + self.max_queue_wait_s, 0.001, 0.05, retry_on=(SubmissionQueueFull,))
        future = await room.call_async(lambda: self.submit(request))  # the last SubmissionQueueFull, past the wait
        try:
            return await asyncio.wrap_future(future)
        except asyncio.CancelledError:  # Ctrl-C in asyncio.run, or the caller's own cancel: nobody will read it
            if isinstance(future, Submission):
                future.abandon()
            raise

    def _check_owner(self) -> None:
        """Raise BackendNotOwned in a process that may not use this backend (a fork of its owner).
        An in-process or remote backend has no child to protect: any process may use it."""
        return None

    def _stop_submissions(self) -> None:
        """Called first by every close(): what waits fails, nothing new is accepted."""
        with _SUBMITTER_LOCK:
            self._submissions_closed = True
            submitter, self._submitter = self._submitter, None
        if submitter is not None:
            submitter.close()

    @property
    def identity_hash(self) -> str | None:
        """The catalog identity of what this backend scores (see scorers.identity)."""
        return self.shape.identity_hash if self.shape else None

    @property
    def combination(self) -> dict[str, Any] | None:
        """How its own reward combines its scorer's terms (required terms, weights): part of a
        panel's identity when a term takes that reward."""
        return None

    @abstractmethod
    def compute_rewards(self, request: RewardRequest) -> RewardResponse: ...

    # -- what a composite holds, and what follows from it --------------------------------------
    def members(self) -> Sequence[RewardBackend]:
        """The backends this one holds (a panel's, its replicas, the one it wraps); a leaf holds none."""
        return ()

    def leaves(self) -> list[RewardBackend]:
        """The backends that score, below every composite (itself, for a leaf)."""
        members = self.members()
        return [leaf for member in members for leaf in member.leaves()] if members else [self]

    def warming(self) -> bool:
        """Whether something it started is still coming up after it said ready (a math child's grading
        workers): a server over it (`serve --recipe`) says ready only once none is. A composite asks its
        members."""
        return any(member.warming() for member in self.members())

    def needs_whole_groups(self) -> bool:
        """Whether scoring a group's candidates apart could change a reward or refuse a call: a
        configured group size, or a groupwise (or unknown) scorer anywhere inside."""
        if self.group_size is not None:
            return True
        members = self.members()
        if members:
            return any(member.needs_whole_groups() for member in members)
        return self.shape is None or self.shape.groupwise

    @property
    def call_bound_s(self) -> float | None:
        """The longest one call may take by the backends' own deadlines (a restart's boot plus a
        request); None where no backend inside states one."""
        bounds = [bound for bound in (member.call_bound_s for member in self.members()) if bound is not None]
        return max(bounds, default=None)

    # -- scoring across ranks (only DistributedRewards spans more than one) -------------------
    @property
    def scoring_world(self) -> tuple[int, int]:
        """(this rank, how many ranks) one call is scored over: (0, 1) for a backend scoring alone."""
        return (0, 1)

    def fail_step(self, error: Exception, step: int | None = None) -> None:  # noqa: B027 - only across ranks
        """The caller could not build its request for `step` and is about to raise `error`. Alone,
        there is nobody to tell; across ranks, every rank raises the same RankFailed instead."""

    needs_start: bool = False  # made with start=False and not started yet (a managed child's backend)

    def start(self) -> Any:
        """Start what the backend runs, if it was made with `start=False` (a managed child); a
        backend with nothing to start is ready when made."""
        return None

    def abort_start(self) -> None:  # noqa: B027 - optional: only a backend that boots a child can abort it
        """From another thread: kill what `start()` is booting, so that it fails at once (Ctrl-C)."""

    def onload(self) -> dict[str, Any]:
        return {}

    def offload(self) -> dict[str, Any]:
        return {}

    def drain(self) -> dict[str, Any]:
        return {}

    def arena(self) -> Arena:
        """Where to build large input arrays before scoring them. A managed child's arena is in
        its shared segment, so those arrays reach the scorer without a copy; elsewhere it is
        ordinary memory. Arrays are valid until the arena is closed (use it as a context manager)."""
        return HeapArena()

    def interrupt(self) -> None:  # noqa: B027 - optional: only a backend with a child can end a call early
        """Give up on calls in flight from other threads (Ctrl-C in a caller that fanned them out)."""

    def close(self) -> None:  # noqa: B027 - optional: most backends have something to release
        """Release everything; idempotent and bounded."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def check_pins(shape: ScorerShape, revision: str | None, identity_hash: str | None) -> None:
    """A configured revision or identity hash must be exactly the scorer's own."""
    if revision is not None and revision != shape.revision:
        raise ConfigError(f"revision pin {revision!r} refused: scorer {shape.name!r} is revision {shape.revision!r}")
    if identity_hash is not None and identity_hash != shape.identity_hash:
        raise ConfigError(
            f"identity_hash pin {identity_hash} refused: scorer {shape.name!r} has identity {shape.identity_hash}"
        )


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


def reward_terms(
    shape: ScorerShape, required: Sequence[str], weights: Mapping[str, float]
) -> tuple[list[str], list[str] | None]:
    """The terms that make the reward, and the terms a request asks the server for (None: all). A
    scorer whose reward is one of its terms (`reward_term`: a served panel's weighted reward) weighs
    its terms itself: `required` then names the terms wanted, the server's reward sums only those,
    and client-side weights are refused (they would weigh the panel's reward again)."""
    reward_term = shape.reward_term
    if reward_term is None:
        return check_reward_names(shape.name, shape.terms, required, weights), None
    if weights:
        raise ConfigError(
            f"scorer {shape.name!r} weighs its own terms into {reward_term!r} (a served panel: its recipe's "
            f"weights); give no client weights ({sorted(weights)})"
        )
    if reward_term not in shape.terms:
        raise RewardContractError(f"scorer {shape.name!r} names reward term {reward_term!r}, not one of its terms")
    wanted = [term for term in check_reward_names(shape.name, shape.terms, required, {}) if term != reward_term]
    return [reward_term], ([*wanted, reward_term] if required and wanted else None)


def request_group_size(request: RewardRequest, configured: int | None) -> int | None:
    """The group size declared by the request or the config; two different ones are refused."""
    if request.group_size is not None and configured is not None and request.group_size != configured:
        raise ScorerRequestError(
            f"request declares group_size {request.group_size}, the backend's config {configured}", kind="bad_input"
        )
    return request.group_size if request.group_size is not None else configured


def score_chunks(
    chunks: Sequence[Sequence[RewardItem]],
    score_chunk: ChunkScorer,
    group_size: int | None,
    at_once: int,
    interrupt: Callable[[], None],
) -> list[ChunkAnswer]:
    """Every chunk's answer, in order. Up to `at_once` chunks are in flight together (a scorer that
    takes concurrent calls: a request costs about its slowest chunk, not the sum of them). One failure
    fails the request: once every chunk has ended (each bounds itself), the earliest failure is raised,
    the cause the others' failures may follow from. Ctrl-C while waiting calls `interrupt` first."""
    if at_once <= 1 or len(chunks) == 1:
        return [score_chunk(chunk, group_size) for chunk in chunks]
    failures: list[tuple[float, int, BaseException]] = []

    def one(index: int) -> ChunkAnswer:
        try:
            return score_chunk(chunks[index], group_size)
        except BaseException as exc:
            failures.append((time.monotonic(), index, exc))
            raise

    outcomes = on_each(range(len(chunks)), one, "chunk", limit=at_once, on_interrupt=interrupt)
    if failures:
        raise min(failures, key=lambda failure: failure[:2])[2]
    return outcomes  # type: ignore[return-value]  # no failure: every outcome is an answer


def score_in_chunks(
    request: RewardRequest,
    size: int,
    score_chunk: ChunkScorer,
    required: Sequence[str],
    weights: Mapping[str, float],
    shape: ScorerShape,
    group_size: int | None = None,
    interrupt: Callable[[], None] = lambda: None,
    max_in_flight: int | None = None,
) -> RewardResponse:
    """Cut the request into chunks of at most `size` items that never split a group, score them
    (together, up to the scorer's `concurrent_calls` and the transport's `max_in_flight`, see
    `score_chunks`), and assemble one response. Groups are checked before anything is sent."""
    group_size = request_group_size(request, group_size)
    chunks = pack_chunks(request_groups(request, shape, group_size), size)
    answers = score_chunks(
        [[request.items[i] for i in chunk] for chunk in chunks],
        score_chunk,
        group_size,
        shape.concurrent_calls if max_in_flight is None else min(shape.concurrent_calls, max_in_flight),
        interrupt,
    )
    merged, reports, failed, term_failed, not_applicable = _merged(len(request.items), chunks, answers)
    scored = np.array([item_id not in failed for item_id in request.ids], dtype=bool)
    _check_filled(shape.name, request.ids, required, merged, scored, term_failed, not_applicable)
    diagnostics = {shape.name: merge_reports(reports)}
    kept = np.flatnonzero(scored)  # every item but those the scorer could not score
    response = assemble_response(
        [request.ids[i] for i in kept],
        {name: scores[kept] for name, scores in merged.items()},
        required,
        weights,
        diagnostics,
        shape.identity_hash,
        term_failed,
        not_applicable,
    )
    if failed:  # the rest's response is the partial (its own term failures kept, for a panel)
        raise items_failed(shape.name, len(request.items), failed, response)
    if any(name in required for name in term_failed):  # the reward lacks a term: only a panel may decide
        raise terms_failed(shape.name, term_failed, response)
    return response


def _check_filled(
    scorer: str,
    ids: Sequence[str],
    required: Sequence[str],
    merged: Mapping[str, np.ndarray],
    scored: np.ndarray,
    term_failed: Mapping[str, Mapping[str, str]],
    not_applicable: Mapping[str, set[str]],
) -> None:
    """A term some chunk lacked is never filled in with zeros, and a term of the reward applies to every
    item: an answer that says otherwise breaks the contract."""
    inapplicable = sorted(set(not_applicable) & set(required))
    if inapplicable:
        raise RewardContractError(
            f"scorer {scorer!r} says terms {inapplicable} of the reward do not apply to some items: a reward "
            "applies to every item"
        )
    for name, scores in merged.items():
        alone = term_failed.get(name, {}).keys() | not_applicable.get(name, set())
        unfilled = [i for i in np.flatnonzero(np.isnan(scores) & scored) if ids[int(i)] not in alone]
        if unfilled:
            raise RewardContractError(f"scorer {scorer!r} term {name!r}: no score for id {ids[int(unfilled[0])]!r}")


def request_groups(request: RewardRequest, shape: ScorerShape, group_size: int | None) -> list[list[int]]:
    """The request's groups as the scorer takes them (positions), checked: the one place a
    GroupInputError becomes the caller's ScorerRequestError."""
    try:
        return partition(
            request.items, group_size, scorer=shape.name, groupwise=shape.groupwise, ragged=shape.ragged_groups
        )
    except GroupInputError as exc:
        raise ScorerRequestError(str(exc), kind="bad_input") from exc


def _merged(
    count: int, chunks: Sequence[Sequence[int]], answers: Sequence[ChunkAnswer]
) -> tuple[dict[str, np.ndarray], list[dict[str, Any]], dict[str, str], dict[str, dict[str, str]], dict[str, set[str]]]:
    """The chunks' scores in request order (NaN where none came), their reports, the failed ids,
    the ids each term alone failed for, and those each term does not apply to."""
    merged: dict[str, np.ndarray] = {}
    reports = []
    failed: dict[str, str] = {}
    term_failed: dict[str, dict[str, str]] = {}
    not_applicable: dict[str, set[str]] = {}
    for chunk, answer in zip(chunks, answers, strict=True):
        for name, scores in answer.terms.items():
            merged.setdefault(name, np.full(count, np.nan))[list(chunk)] = scores
        reports.append(report(len(chunk), answer.diagnostics))
        failed.update(answer.failed)
        for name, whys in answer.term_failed.items():
            term_failed.setdefault(name, {}).update(whys)
        for name, ids in answer.not_applicable.items():
            not_applicable.setdefault(name, set()).update(ids)
    return merged, reports, failed, term_failed, not_applicable


def terms_failed(
    scorer: str, term_failed: Mapping[str, Mapping[str, str]], response: RewardResponse
) -> ScorerTermsFailed:
    """The error for terms a scorer failed alone for some items; `response` keeps every item's other terms."""
    whys = {item_id: f"term {name!r}: {why}" for name, failed in term_failed.items() for item_id, why in failed.items()}
    listed = "; ".join(f"{item_id!r}: {why}" for item_id, why in list(whys.items())[:8])
    more = f"; and {len(whys) - 8} more" if len(whys) > 8 else ""
    return ScorerTermsFailed(
        f"scorer {scorer!r} failed terms {sorted(term_failed)} for {len(whys)} items: {listed}{more}", whys, response
    )


def assemble_response(
    ids: list[str],
    terms: Mapping[str, np.ndarray],
    required: Sequence[str],
    weights: Mapping[str, float],
    diagnostics: Mapping[str, Any],
    identity_hash: str | None = None,
    term_failed: Mapping[str, Mapping[str, str]] | None = None,
    not_applicable: Mapping[str, set[str] | frozenset[str]] | None = None,
) -> RewardResponse:
    """final = sum(weight * term) over the required terms; every item a success or we raised. A term
    the scorer says failed alone for an item (`term_failed`) is that item's TermFailure: no value
    (None), the item not a success. For a term of the reward, of kind SCORER_TERM_FAILED: the item's
    reward is not usable (the caller raises); for another term (a served panel's optional
    component), of kind term_failed: the reward stands without it. A term that does not apply to an
    item (`not_applicable`, a served panel's term limited to some data sources) is None there, and
    `applicable` says so; a term of the reward always applies (the answer was checked for it)."""
    rewards = np.zeros(len(ids), dtype=np.float64)
    alone = {name: [item_id in whys for item_id in ids] for name, whys in (term_failed or {}).items()}
    applicable = {name: [i not in where for i in ids] for name, where in (not_applicable or {}).items()}
    for term in required:
        values = np.asarray(terms[term], dtype=np.float64)
        rewards += weights.get(term, 1.0) * np.where(alone.get(term, False), 0.0, values)
    failures = [
        {
            "term": name,
            "ids": [i for i in ids if whys.get(i) == why],
            "error": why,
            "kind": SCORER_TERM_FAILED if name in required else "term_failed",
        }
        for name, whys in (term_failed or {}).items()
        for why in dict.fromkeys(whys[i] for i in ids if i in whys)
    ]
    return RewardResponse.checked(  # a weighted sum that overflows is caught there
        ids=ids,
        rewards=rewards.tolist(),
        component_rewards={
            name: [
                None
                if (name in alone and alone[name][i]) or (name in applicable and not applicable[name][i])
                else float(v)
                for i, v in enumerate(values)
            ]
            for name, values in terms.items()
        },
        applicable={name: mask for name, mask in applicable.items() if name in terms},
        term_failures=failures,
        diagnostics=dict(diagnostics),
        identity_hash=identity_hash,
    )
