"""The chunking engine: a request cut into chunks that never split a group, each scored by the
backend's `ChunkScorer`, the answers merged into one response.

A call reads: `score_in_chunks(request, plan, scorer)` -> `score_chunks` (in order, or up to the
plan's concurrency at once) -> `scorer.score_chunk(items, group_size)` for each chunk ->
`Merged.of(...)` -> `assemble_response`. The backend states what it knows once, in its `CallPlan`.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, NamedTuple, Protocol

import numpy as np

from scorers import tail
from scorers.diagnostics import merge_reports, report
from scorers.groups import GroupInputError, IncompleteGroups, pack_chunks, partition
from supervisor.assembly import assemble_response, details_of, terms_failed
from supervisor.errors import (
    GroupsIncomplete,
    GroupSizeConflict,
    RewardContractError,
    ScorerRequestError,
)
from supervisor.fanout import on_each
from supervisor.joined import items_failed
from supervisor.outcome import Outcome
from supervisor.shape import ScorerShape
from supervisor.types import RewardItem, RewardRequest

# each chunk's time as the caller saw it, beside its scorer's diagnostics (runtime's names)
CHUNK_S, SLOWEST_CHUNKS = "runtime.chunk_s", "runtime.slowest_chunks"


class ChunkAnswer(NamedTuple):
    """What one exchange with the scorer answers, whatever runs it."""

    terms: Mapping[str, np.ndarray]
    diagnostics: Mapping[str, Any]
    failed: Mapping[str, str]  # ids the scorer could not score -> why
    # per term, the ids that term alone failed for -> why
    term_failed: Mapping[str, Mapping[str, str]]
    # per term, the ids it does not apply to
    not_applicable: Mapping[str, frozenset[str]] = MappingProxyType({})
    # id -> what the scorer says of that item (scorers.details; reporting only)
    details: Mapping[str, Any] = MappingProxyType({})


class ChunkScorer(Protocol):
    """What scores one chunk for a backend (the backend itself, or one call's view of it)."""

    def score_chunk(self, chunk: Sequence[RewardItem], group_size: int | None) -> ChunkAnswer: ...

    def interrupt(self) -> None:
        """Give up on chunks in flight (Ctrl-C while the engine waits for them)."""


@dataclass(frozen=True)
class CallPlan:
    """What a backend states once about how its calls are cut and their reward made."""

    shape: ScorerShape
    batch_size: int  # at most this many items a chunk
    required_rewards: Sequence[str]  # the terms that make the reward
    weights: Mapping[str, float] = field(default_factory=dict)
    group_size: int | None = None  # configured: every group of every request has this size
    # the transport's own bound on chunks at once (None: the scorer's)
    max_in_flight: int | None = None
    time_chunks: bool = False  # each chunk timed into the response (`ChunkTimes`)

    @property
    def at_once(self) -> int:
        calls = self.shape.concurrent_calls
        return calls if self.max_in_flight is None else min(calls, self.max_in_flight)


def request_group_size(
    request: RewardRequest, configured: int | None, where: str = "backend"
) -> int | None:
    """The group size declared by the config, else by the request; a request that declares
    another size than the configured one is refused (GroupSizeConflict): it never overrides it."""
    if (
        request.group_size is not None
        and configured is not None
        and request.group_size != configured
    ):
        raise GroupSizeConflict(request.group_size, configured, where)
    return configured if configured is not None else request.group_size


def request_groups(
    request: RewardRequest, shape: ScorerShape, group_size: int | None
) -> list[list[int]]:
    """The request's groups as the scorer takes them (positions), checked: the one place a
    GroupInputError becomes the caller's ScorerRequestError (GroupsIncomplete for groups that
    are not of the declared size, whatever the scorer)."""
    return _partitioned(
        request,
        group_size,
        scorer=shape.name,
        groupwise=shape.groupwise,
        ragged=shape.ragged_groups,
    )


def check_groups(request: RewardRequest, configured: int | None, where: str) -> int | None:
    """The call's group size (see `request_group_size`), its groups checked complete before
    anything is scored: for backends and composites that do not cut chunks themselves."""
    group_size = request_group_size(request, configured, where)
    _partitioned(request, group_size, scorer=where)
    return group_size


def _partitioned(
    request: RewardRequest, group_size: int | None, *, scorer: str, **how: bool
) -> list[list[int]]:
    try:
        return partition(
            request.items,
            group_size,
            scorer=scorer,
            elsewhere=request.groups_elsewhere,
            **how,
        )
    except IncompleteGroups as exc:
        raise GroupsIncomplete(str(exc), exc.group_size, exc.counts) from exc
    except GroupInputError as exc:
        raise ScorerRequestError(str(exc), kind="bad_input") from exc


def score_in_chunks(request: RewardRequest, plan: CallPlan, scorer: ChunkScorer) -> Outcome:
    """Cut the request into chunks of at most `plan.batch_size` items that never split a group,
    score them (together, up to `plan.at_once`, see `score_chunks`), and assemble one outcome: the
    response, or the items or terms the scorer failed beside what it scored. Groups are checked
    before anything is sent; a failure of a whole chunk is raised."""
    group_size = request_group_size(request, plan.group_size)
    chunks = pack_chunks(request_groups(request, plan.shape, group_size), plan.batch_size)
    # groups spanning ranks were checked whole here: their part travels without the size
    sent_size = None if request.groups_elsewhere else group_size
    timed = ChunkTimes(scorer) if plan.time_chunks else scorer
    answers = score_chunks(
        [[request.items[i] for i in chunk] for chunk in chunks], timed, sent_size, plan.at_once
    )
    merged = Merged.of(len(request.items), chunks, answers)
    scored = np.array([item_id not in merged.failed for item_id in request.ids], dtype=bool)
    merged.check_filled(plan.shape.name, request.ids, plan.required_rewards, scored)
    kept = np.flatnonzero(scored)  # every item but those the scorer could not score
    kept_ids = [request.ids[i] for i in kept]
    response = assemble_response(
        kept_ids,
        {name: scores[kept] for name, scores in merged.scores.items()},
        plan.required_rewards,
        plan.weights,
        {plan.shape.name: merge_reports(merged.reports)},
        plan.shape.identity_hash,
        merged.term_failed,
        merged.not_applicable,
        details_of(plan.shape.name, kept_ids, merged.details),
    )
    # the rest's response is the partial (its own term failures kept, for a panel)
    if merged.failed:
        return Outcome.items_failed(
            items_failed(plan.shape.name, len(request.items), merged.failed, response), response
        )
    # the reward lacks a term: a panel decides
    if any(name in plan.required_rewards for name in merged.term_failed):
        return Outcome.terms_failed(
            terms_failed(plan.shape.name, merged.term_failed, response), response
        )
    return Outcome.scored(response)


def score_chunks(
    chunks: Sequence[Sequence[RewardItem]],
    scorer: ChunkScorer,
    group_size: int | None,
    at_once: int,
) -> list[ChunkAnswer]:
    """Every chunk's answer, in order. Up to `at_once` chunks are in flight together (a scorer that
    takes concurrent calls: a request costs about its slowest chunk, not the sum of them). One
    failure fails the request: once every chunk has ended (each bounds itself), the earliest failure
    is raised, the cause the others' failures may follow from. Ctrl-C while waiting interrupts the
    scorer first."""
    if at_once <= 1 or len(chunks) == 1:
        return [scorer.score_chunk(chunk, group_size) for chunk in chunks]
    failures: list[tuple[float, int, BaseException]] = []

    def one(index: int) -> ChunkAnswer:
        try:
            return scorer.score_chunk(chunks[index], group_size)
        except BaseException as exc:
            failures.append((time.monotonic(), index, exc))
            raise

    outcomes = on_each(
        range(len(chunks)), one, "chunk", limit=at_once, on_interrupt=scorer.interrupt
    )
    if failures:
        raise min(failures, key=lambda failure: failure[:2])[2]
    return outcomes  # type: ignore[return-value]  # no failure: every outcome is an answer


class ChunkTimes:
    """A ChunkScorer whose answers carry their own time, as the caller saw it (the transport, a
    child's queue, hedges and limit waits included): `CHUNK_S`, a histogram of one, and
    `SLOWEST_CHUNKS`, the chunk named by its first item's id and size. Merged like any diagnostic,
    a step's report says how its chunks went, for scorers that time nothing themselves."""

    def __init__(self, scorer: ChunkScorer) -> None:
        self.scorer = scorer

    def score_chunk(self, chunk: Sequence[RewardItem], group_size: int | None) -> ChunkAnswer:
        began = time.monotonic()
        answer = self.scorer.score_chunk(chunk, group_size)
        seconds = time.monotonic() - began
        name = chunk[0].id if len(chunk) == 1 else f"{chunk[0].id} (+{len(chunk) - 1})"
        times = {
            CHUNK_S: tail.histogram([seconds]),
            SLOWEST_CHUNKS: tail.slowest([(name, seconds)]),
        }
        return answer._replace(diagnostics={**answer.diagnostics, **times})

    def interrupt(self) -> None:
        self.scorer.interrupt()


@dataclass
class Merged:
    """The chunks' answers in request order: scores (NaN where none came), reports, the failed ids,
    the ids each term alone failed for, those each term does not apply to, and items' details."""

    scores: dict[str, np.ndarray] = field(default_factory=dict)
    reports: list[dict[str, Any]] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    term_failed: dict[str, dict[str, str]] = field(default_factory=dict)
    not_applicable: dict[str, set[str]] = field(default_factory=dict)
    details: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(
        cls, count: int, chunks: Sequence[Sequence[int]], answers: Sequence[ChunkAnswer]
    ) -> Merged:
        merged = cls()
        for chunk, answer in zip(chunks, answers, strict=True):
            for name, scores in answer.terms.items():
                merged.scores.setdefault(name, np.full(count, np.nan))[list(chunk)] = scores
            merged.reports.append(report(len(chunk), answer.diagnostics))
            merged.failed.update(answer.failed)
            for name, whys in answer.term_failed.items():
                merged.term_failed.setdefault(name, {}).update(whys)
            for name, ids in answer.not_applicable.items():
                merged.not_applicable.setdefault(name, set()).update(ids)
            merged.details.update(answer.details)
        return merged

    def check_filled(
        self, scorer: str, ids: Sequence[str], required: Sequence[str], scored: np.ndarray
    ) -> None:
        """A term some chunk lacked is never filled in with zeros, and a term of the reward applies
        to every item: an answer that says otherwise breaks the contract."""
        inapplicable = sorted(set(self.not_applicable) & set(required))
        if inapplicable:
            raise RewardContractError(
                f"scorer {scorer!r} says terms {inapplicable} of the reward do not apply to "
                f"some items: a "
                "reward applies to every item"
            )
        for name, scores in self.scores.items():
            alone = self.term_failed.get(name, {}).keys() | self.not_applicable.get(name, set())
            unfilled = [
                i for i in np.flatnonzero(np.isnan(scores) & scored) if ids[int(i)] not in alone
            ]
            if unfilled:
                raise RewardContractError(
                    f"scorer {scorer!r} term {name!r}: no score for id {ids[int(unfilled[0])]!r}"
                )
