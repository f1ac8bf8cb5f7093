"""RewardPanel: several named reward terms, each on its own backend, combined into one reward.

`final = sum(weight * term)` over the terms that apply to an item (matched on its
`data_source`). A required term's failure fails the call; an optional term's scoring
failure is recorded (term, ids, error) and adds nothing. A setup or lifecycle failure
(a child that cannot boot, a crash loop, a backend used from a fork) is fatal whatever
the term. Backends are scored concurrently; terms bound to one backend share one call.
"""

from __future__ import annotations

import copy
import logging
import math
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from child_runtime.protocol.wire import RESIDENCY_FAILED
from scorers.diagnostics import check_name
from scorers.identity import canonical_json, digest
from supervisor.backend import RewardBackend
from supervisor.chunks import check_groups, request_group_size
from supervisor.compose.build import build_all
from supervisor.composition import Component, component, outcome_of
from supervisor.errors import (
    BackendNotOwned,
    ConfigError,
    RankFailed,
    RankLost,
    RewardContractError,
    ScorerCrashLoop,
    ScorerError,
    ScorerItemsFailed,
    ScorerRequestError,
    ScorerStartupError,
)
from supervisor.fanout import on_each
from supervisor.outcome import Outcome, as_outcomes
from supervisor.types import (
    SCORER_TERM_FAILED,
    RewardItem,
    RewardRequest,
    RewardResponse,
    TermFailure,
)

# Failures that say the backend cannot serve at all, not that one batch could not be scored.
# Never an optional term's recorded failure: fatal to the call. Only a scorer's own refusal
# (ScorerRequestError) is retried on a narrower share; a death, a timeout or a lost transport
# fails the shared call once, as the backend alone would (a poison item is never sent twice).
LIFECYCLE_ERRORS: tuple[type[BaseException], ...] = (
    ScorerStartupError,
    ScorerCrashLoop,
    BackendNotOwned,
    ConfigError,
    RankFailed,  # a retry would be a collective only some ranks enter
    RankLost,
)
ANY_DATASET = "*"
GROUP_FAILURES = ("whole_group", "raise")
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PanelTerm:
    """One named term: a backend, the value taken from it, its weight and whether it is required.

    `weight` is a number, or per dataset `{data_source: weight}` (`"*"` for the rest).
    `applicable_datasets` limits the term to items with one of those `data_source` tags;
    None: every item. `component` picks one of the backend's own terms; None: its reward.
    """

    name: str
    backend: RewardBackend
    weight: float | Mapping[str, float] = 1.0
    required: bool = True
    applicable_datasets: Sequence[str] | None = None
    component: str | None = None

    def applies(self, item: RewardItem) -> bool:
        return self.applicable_datasets is None or item.data_source in self.applicable_datasets

    def weight_for(self, item: RewardItem) -> float:
        if not isinstance(self.weight, Mapping):
            return float(self.weight)
        if item.data_source is not None and item.data_source in self.weight:
            return float(self.weight[item.data_source])
        if ANY_DATASET in self.weight:
            return float(self.weight[ANY_DATASET])
        raise ScorerRequestError(
            f"term {self.name!r} has no weight for item {item.id!r} (data_source "
            f"{item.data_source!r}); weights are given for {sorted(self.weight)}",
            kind="bad_input",
        )

    def describe(self) -> dict[str, Any]:
        """What the panel identity covers for this term."""
        weight = (
            dict(sorted(self.weight.items()))
            if isinstance(self.weight, Mapping)
            else float(self.weight)
        )
        return {
            "name": self.name,
            "scorer": component(self.backend).identity_hash,
            # the backend's own reward is its required terms, weighted: part of what this term means
            "combination": component(self.backend).combination if self.component is None else None,
            "component": self.component,
            "weight": weight,
            "required": self.required,
            "applicable_datasets": sorted(self.applicable_datasets)
            if self.applicable_datasets is not None
            else None,
        }


@dataclass
class _Call:
    """One backend's share of a request: the items any of its terms applies to."""

    backend: RewardBackend
    terms: list[PanelTerm]
    positions: list[int] = field(default_factory=list)


@dataclass
class _Gathered:
    """What a panel's backends answered, term by term, as their outcomes are settled."""

    values: dict[str, list[float | None]]
    failures: list[TermFailure] = field(default_factory=list)
    diagnostics: dict[str, Any] = field(default_factory=dict)
    details: dict[str, Any] = field(default_factory=dict)  # keyed as diagnostics
    fatal: list[tuple[str, str, BaseException]] = field(default_factory=list)  # (terms, why, error)


def _fatal_reason(call: _Call, error: BaseException) -> str | None:
    """Why a backend's failure fails the panel's call, or None: only its optional terms lose their
    values."""
    if isinstance(error, LIFECYCLE_ERRORS):
        return "setup failure"
    if isinstance(error, ScorerRequestError) and error.kind == RESIDENCY_FAILED:
        # a model that could not wake or sleep: never an optional term's loss
        return "lifecycle failure"
    if any(term.required for term in call.terms):
        return "required"
    if not isinstance(error, ScorerError):
        return "not a scorer error"
    return None


class RewardPanel(Component):
    """A RewardBackend over named terms. Closing it closes the backends it owns (or returns them
    to the `BackendPool` they came from)."""

    def __init__(
        self,
        terms: Sequence[PanelTerm],
        *,
        owns_backends: bool = True,
        release: Callable[[], None] | None = None,
        group_size: int | None = None,
        group_failures: str = "whole_group",
    ) -> None:
        """`group_failures`: an optional term that fails on some members of a group fails for the
        whole group ("whole_group": a group-relative advantage never compares members scored by
        different terms), or the call is refused ("raise")."""
        if not terms:
            raise ConfigError("a panel needs at least one term")
        if group_failures not in GROUP_FAILURES:
            raise ConfigError(
                f"group_failures must be one of {GROUP_FAILURES}, got {group_failures!r}"
            )
        self.group_failures = group_failures
        seen: set[str] = set()
        for term in terms:
            try:
                check_name(term.name, "term name")
            except ValueError as exc:
                raise ConfigError(str(exc)) from exc
            if term.name in seen:
                raise ConfigError(f"term name {term.name!r} is used twice in the panel")
            seen.add(term.name)
            _check_term(term)
        self.terms = list(terms)
        self.group_size = group_size
        self._owns = owns_backends
        self._release = release
        self._closed = False
        self._lock = threading.Lock()
        self.backends: list[RewardBackend] = []
        for term in self.terms:
            if not any(term.backend is b for b in self.backends):
                self.backends.append(term.backend)

    @property
    def identity_hash(self) -> str:
        """Its terms' scorer identities, weights, required flags and applicability."""
        described: dict[str, Any] = {"panel": [term.describe() for term in self.terms]}
        # the default leaves the identities of earlier panels as they were
        if self.group_failures != "whole_group":
            described["group_failures"] = self.group_failures
        return digest(described)

    def _plan(self, request: RewardRequest) -> tuple[list[_Call], dict[str, list[float | None]]]:
        """Who scores what, and every item's weights: refusals happen here, before any scoring."""
        calls = [_Call(b, [t for t in self.terms if t.backend is b]) for b in self.backends]
        weights: dict[str, list[float | None]] = {t.name: [] for t in self.terms}
        for position, item in enumerate(request.items):
            applicable = False
            for term in self.terms:
                applies = term.applies(item)
                weights[term.name].append(term.weight_for(item) if applies else None)
                applicable = applicable or applies
            if not applicable:
                raise ScorerRequestError(
                    f"no term of the panel applies to item {item.id!r} (data_source "
                    f"{item.data_source!r}); terms: "
                    f"{[(t.name, t.applicable_datasets) for t in self.terms]}",
                    kind="bad_input",
                )
            for call in calls:
                if any(term.applies(item) for term in call.terms):
                    call.positions.append(position)
        # a term with nothing to score in this request takes no part in its backend's call
        for call in calls:
            call.terms = [
                t for t in call.terms if any(t.applies(request.items[p]) for p in call.positions)
            ]
        return [call for call in calls if call.positions], weights

    def _sized(self, request: RewardRequest) -> RewardRequest:
        """The request with the panel's group size, its groups checked complete before any term
        scores (every backend, a trainer's own included); a request that declares another size
        than the panel's is refused (GroupSizeConflict)."""
        group_size = request_group_size(request, self.group_size, "panel")
        if group_size is None:
            return request
        check_groups(request, group_size, "panel")
        return request.model_copy(update={"group_size": group_size})

    def score(self, request: RewardRequest) -> Outcome:
        if self._closed:
            raise RuntimeError("RewardPanel is closed")
        request = self._sized(request)
        calls, weights = self._plan(request)
        outcomes = self._score_concurrently(request, calls)
        got = _Gathered({t.name: [None] * len(request.items) for t in self.terms})
        for call, outcome in zip(calls, outcomes, strict=True):
            self._settle(call, outcome, request, got)
        if got.fatal:
            terms, why, error = got.fatal[0]
            # the term's own rewards, not this panel's: nothing above takes them
            error = _without_partial(error)
            error.add_note(f"panel term(s) {terms}: {why}")
            return Outcome.raised(error)
        failures = self._whole_groups(request, got.failures, got.values)
        response = RewardResponse.checked(  # a weighted sum that overflows is caught there
            ids=request.ids,
            rewards=self._weighted(got.values, weights, len(request.items)),
            component_rewards=got.values,
            applicable={t.name: [w is not None for w in weights[t.name]] for t in self.terms},
            term_failures=failures,
            diagnostics=got.diagnostics,
            details=got.details,
            identity_hash=self.identity_hash,
        )
        return Outcome.scored(response)

    def _settle(
        self, call: _Call, outcome: Outcome, request: RewardRequest, got: _Gathered
    ) -> None:
        """One backend's outcome into `got`: its values, its optional terms' failure, or a fatal
        error."""
        if outcome.kind == "terms_failed" and outcome.response is not None:  # each term decides
            record = outcome.error.record if isinstance(outcome.error, ScorerError) else None
            self._take(call, outcome.response, request, got, record)
            return
        if (
            outcome.kind == "items_failed"
            and outcome.response is not None
            and not _any_required(call)
        ):
            self._take_partial(call, outcome, request, got)
            return
        # the scorer's own refusal: perhaps of an optional item
        if isinstance(outcome.error, ScorerRequestError):
            narrowed = self._required_share(call, request)
            # optional terms brought items of their own: never let them sink the rest
            if narrowed is not None:
                (retry,) = self._score_concurrently(request, [narrowed])
                if retry.ok and retry.response is not None:
                    refused = outcome.error
                    got.failures.extend(
                        self._failed(t, call, request, refused)
                        for t in call.terms
                        if not t.required
                    )
                    self._take(narrowed, retry.response, request, got)
                    return
                outcome = retry  # the required terms' own items fail too
        if outcome.error is None and outcome.response is not None:
            self._take(call, outcome.response, request, got)
            return
        error = outcome.error
        assert error is not None  # not scored: a failure by construction
        why = _fatal_reason(call, error)
        if why is not None:
            got.fatal.append((", ".join(t.name for t in call.terms), why, error))
        else:
            got.failures.extend(self._failed(term, call, request, error) for term in call.terms)

    def _weighted(
        self,
        values: dict[str, list[float | None]],
        weights: dict[str, list[float | None]],
        count: int,
    ) -> list[float]:
        """Each item's reward: the sum of weight * value over the terms that apply and gave one."""
        rewards = []
        for i in range(count):
            total = 0.0
            for term in self.terms:
                value, weight = values[term.name][i], weights[term.name][i]
                if value is not None and weight is not None:
                    total += weight * value
            rewards.append(total)
        return rewards

    def _whole_groups(
        self,
        request: RewardRequest,
        failures: list[TermFailure],
        values: dict[str, list[float | None]],
    ) -> list[TermFailure]:
        """Each failure of one of this panel's terms widened to every member of the groups it
        touches (those members lose that term's value too), or the call refused (`group_failures`
        "raise"). A nested panel's failures arrive widened already."""
        members: dict[str, list[int]] = {}
        for position, item in enumerate(request.items):
            if item.group_id is not None:
                members.setdefault(item.group_id, []).append(position)
        if not members:
            return failures
        position_of = {item.id: position for position, item in enumerate(request.items)}
        terms = {term.name: term for term in self.terms}
        widened = []
        for failure in failures:
            term = terms.get(failure.term)
            if term is None:
                widened.append(failure)
                continue
            touched = sorted(
                {
                    g
                    for i in failure.ids
                    if (g := request.items[position_of[i]].group_id) is not None
                }
            )
            whole = [p for g in touched for p in members[g] if term.applies(request.items[p])]
            already = set(failure.ids)
            extra = [request.items[p].id for p in whole if request.items[p].id not in already]
            if extra and self.group_failures == "raise":
                raise ScorerItemsFailed(
                    f"optional term {term.name!r} failed on {len(failure.ids)} members of "
                    f"groups {touched[:5]} but not on {extra[:5]}: the panel refuses partial "
                    f"groups (group_failures='raise'): {failure.error}",
                    kind="partial_group",
                    failed={item_id: failure.error for item_id in [*failure.ids, *extra]},
                )
            for position in whole:
                values[term.name][position] = None
            ids = [*failure.ids, *extra]
            widened.append(failure.model_copy(update={"ids": ids}) if extra else failure)
        return widened

    @staticmethod
    def _required_share(call: _Call, request: RewardRequest) -> _Call | None:
        """The call narrowed to its required terms' items, when its optional terms added others."""
        required = [t for t in call.terms if t.required]
        if not required or len(required) == len(call.terms):
            return None
        positions = [
            p for p in call.positions if any(t.applies(request.items[p]) for t in required)
        ]
        return (
            _Call(call.backend, required, positions)
            if len(positions) < len(call.positions)
            else None
        )

    @staticmethod
    def _failed(
        term: PanelTerm, call: _Call, request: RewardRequest, error: BaseException
    ) -> TermFailure:
        ids = [request.items[p].id for p in call.positions if term.applies(request.items[p])]
        _warn_repeatedly(
            term.name, str(error), "failed for %d items (they get nothing from it)", len(ids)
        )
        return TermFailure(term=term.name, ids=ids, error=str(error), kind=type(error).__name__)

    def _score_concurrently(self, request: RewardRequest, calls: list[_Call]) -> list[Outcome]:
        """Each backend's share at the same time, each one's outcome (what it raised included)."""

        def one(call: _Call) -> Outcome:
            share = [request.items[p] for p in call.positions]
            return outcome_of(
                call.backend,
                RewardRequest(
                    items=share,
                    group_size=request.group_size,
                    step=request.step,
                    groups_elsewhere=request.groups_elsewhere,
                ),
            )

        def interrupt() -> None:  # Ctrl-C while the backends score: end what can be ended
            for call in calls:
                component(call.backend).interrupt()

        # Daemon threads, one per backend (see fanout): a Ctrl-C never waits for an in-process
        # scorer.
        return as_outcomes(on_each(calls, one, "panel", on_interrupt=interrupt))

    def _take_partial(
        self, call: _Call, outcome: Outcome, request: RewardRequest, got: _Gathered
    ) -> None:
        """Optional terms whose backend could not score some items: those items get nothing from
        them (recorded by id), the others keep their values."""
        # items_failed: both by construction
        assert outcome.response is not None and outcome.error is not None
        error = outcome.error
        missing = [p for p in call.positions if request.items[p].id in outcome.failed]
        gone = set(missing)
        scored = _Call(call.backend, call.terms, [p for p in call.positions if p not in gone])
        self._take(scored, outcome.response, request, got)
        for term in call.terms:
            ids = [request.items[p].id for p in missing if term.applies(request.items[p])]
            if ids:
                _warn_repeatedly(term.name, str(error), "%d items got no value from it", len(ids))
                got.failures.append(
                    TermFailure(
                        term=term.name, ids=ids, error=str(error), kind=type(error).__name__
                    )
                )

    def _take(
        self,
        call: _Call,
        response: RewardResponse,
        request: RewardRequest,
        got: _Gathered,
        record: Any = None,
    ) -> None:
        """A backend's answer for its terms: their values at the call's positions, nested failures,
        reports."""
        expected = [request.items[p].id for p in call.positions]
        if response.ids != expected:  # a backend answered for other samples: never attach
            raise RewardContractError(
                f"backend for terms {[t.name for t in call.terms]} answered for other ids"
            )
        scorer_lost = {
            i: f for f in response.term_failures if f.kind == SCORER_TERM_FAILED for i in f.ids
        }
        usable = [
            ok or i in scorer_lost for ok, i in zip(response.usable(), response.ids, strict=True)
        ]
        # usable: finite, by the response's own rule (types.first_non_finite)
        for term in call.terms:
            if term.component is not None:
                self._take_component(term, call, response, request, got, usable, record)
                continue
            # the scorer failed a term of the reward: the item has none
            lost: dict[str, TermFailure] = {}
            for j, position in enumerate(call.positions):
                if term.applies(request.items[position]):
                    value = response.rewards[j]
                    if expected[j] in scorer_lost:
                        lost[expected[j]] = scorer_lost[expected[j]]
                    elif value is None or not usable[j]:
                        why = response.errors[j] or "no value"
                        raise RewardContractError(
                            f"term {term.name!r}: no usable value for id {expected[j]!r} ({why})"
                        )
                    else:
                        got.values[term.name][position] = value
            self._lose(term, lost, got, record)
            # a panel inside a panel: its optional terms' failures
            for inner in response.term_failures:
                if inner.kind != SCORER_TERM_FAILED:
                    got.failures.append(
                        inner.model_copy(update={"term": f"{term.name}.{inner.term}"})
                    )
            self._take_reports(term, response, got)

    @staticmethod
    def _take_reports(term: PanelTerm, response: RewardResponse, got: _Gathered) -> None:
        """The term's diagnostics and items' details, named after it (a panel inside a panel: its
        terms', named under this term)."""
        one = len(response.diagnostics) == 1  # one scorer: its reports are the term's
        for mine, theirs in (
            (got.diagnostics, response.diagnostics),
            (got.details, response.details),
        ):
            mine.update(
                {term.name if one else f"{term.name}.{inner}": rep for inner, rep in theirs.items()}
            )

    def _take_component(
        self,
        term: PanelTerm,
        call: _Call,
        response: RewardResponse,
        request: RewardRequest,
        got: _Gathered,
        usable: list[bool],
        record: Any = None,
    ) -> None:
        """One of the backend's own terms: where the backend says that term alone failed for an item
        (a TermFailure of the component), an optional term records it and adds nothing; a required
        one raises naming the term and the ids."""
        failed = {i: f for f in response.term_failures if f.term == term.component for i in f.ids}
        values = response.component_rewards[str(term.component)]
        lost: dict[str, TermFailure] = {}
        for j, position in enumerate(call.positions):
            item_id = response.ids[j]
            if not term.applies(request.items[position]):
                continue
            if item_id in failed:
                lost[item_id] = failed[item_id]
                continue
            value = values[j]
            if value is None or not usable[j]:
                why = response.errors[j] or "no value"
                raise RewardContractError(
                    f"term {term.name!r}: no usable value for id {item_id!r} ({why})"
                )
            got.values[term.name][position] = value
        self._lose(term, lost, got, record)
        self._take_reports(term, response, got)

    @staticmethod
    def _lose(
        term: PanelTerm, lost: Mapping[str, TermFailure], got: _Gathered, record: Any = None
    ) -> None:
        """Items that got no value from `term` because its scorer failed it for them: a required
        term raises naming them (and the child, `record`, when known); an optional one records
        them."""
        if lost and term.required:
            whys = {item_id: failure.error for item_id, failure in lost.items()}
            raise ScorerItemsFailed(
                f"required term {term.name!r} failed for {len(whys)} items: "
                f"{next(iter(whys.values()))}",
                record,
                kind="term_failed",
                failed=whys,
            )
        grouped: dict[str, list[str]] = {}
        for item_id, failure in lost.items():
            grouped.setdefault(failure.error, []).append(item_id)
        for error, ids in grouped.items():
            _warn_repeatedly(
                term.name, error, "failed for %d items (they get nothing from it)", len(ids)
            )
            got.failures.append(
                TermFailure(term=term.name, ids=ids, error=error, kind="term_failed")
            )

    def _check_owner(self) -> None:
        for term in self.terms:
            term.backend._check_owner()

    def members(self) -> list[RewardBackend]:
        return list(self.backends)

    def needs_whole_groups(self, sizes_checked: bool = False) -> bool:
        """Also when a term is optional: its failure must cover a group whole, never part of one."""
        return super().needs_whole_groups(sizes_checked) or any(
            not term.required for term in self.terms
        )

    def onload(self) -> dict[str, Any]:
        return {str(i): backend.onload() for i, backend in enumerate(self.backends)}

    def offload(self) -> dict[str, Any]:
        return {str(i): backend.offload() for i, backend in enumerate(self.backends)}

    def drain(self) -> dict[str, Any]:
        return {str(i): backend.drain() for i, backend in enumerate(self.backends)}

    def interrupt(self) -> None:
        for backend in self.backends:
            component(backend).interrupt()

    def close(self) -> None:
        self._stop_submissions()
        with self._lock:
            if self._closed:
                return
            self._closed = True
        if self._release is not None:
            self._release()
        elif self._owns:
            errors = []
            for backend in self.backends:
                try:
                    backend.close()
                except Exception as exc:  # noqa: BLE001 - every backend is closed; the first error is raised
                    errors.append(exc)
            if errors:
                raise errors[0]


_WARNED: dict[tuple[str, str], int] = {}
_WARNED_LOCK = threading.Lock()
_WARN_EVERY = 100  # after the first, every 100th identical warning, with its count


def _warn_repeatedly(term: str, error: str, what: str, count: int) -> None:
    """An optional term's failure, warned the first time and then every 100th time it recurs word
    for word (a term that fails on every batch of a long run says so once, not once per batch)."""
    with _WARNED_LOCK:
        seen = _WARNED[(term, error)] = _WARNED.get((term, error), 0) + 1
        if len(_WARNED) > 1024:  # many distinct errors: forget the oldest
            del _WARNED[next(iter(_WARNED))]
    if seen == 1 or seen % _WARN_EVERY == 0:
        again = f" (the same failure {seen} times so far)" if seen > 1 else ""
        log.warning(f"optional reward term %r {what}: %s{again}", term, count, error)
    else:
        log.debug(f"optional reward term %r {what}: %s", term, count, error)


def _any_required(call: _Call) -> bool:
    return any(term.required for term in call.terms)


def _check_term(term: PanelTerm) -> None:
    weights = list(term.weight.values()) if isinstance(term.weight, Mapping) else [term.weight]
    for weight in weights:
        if (
            isinstance(weight, bool)
            or not isinstance(weight, (int, float))
            or not math.isfinite(weight)
        ):
            raise ConfigError(f"term {term.name!r}: weight {weight!r} is not a finite number")
    if isinstance(term.applicable_datasets, str):
        raise ConfigError(
            f"term {term.name!r}: applicable_datasets must be a list of tags, not one string"
        )
    if term.applicable_datasets is not None and not term.applicable_datasets:
        raise ConfigError(
            f"term {term.name!r}: applicable_datasets is empty (it would never apply)"
        )
    shape = component(term.backend).shape
    if (
        term.component is not None
        and shape is not None
        and shape.terms
        and term.component not in shape.terms
    ):
        raise ConfigError(
            f"term {term.name!r}: component {term.component!r} is not a term of scorer "
            f"{shape.name!r} (it has {list(shape.terms)})"
        )


class BackendPool:
    """One backend per configuration, shared by every term and panel that names it (train and
    validation panels included); closed when its last user releases it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._backends: dict[bytes, tuple[RewardBackend, int]] = {}

    def acquire(self, config: Any, build: Callable[[], RewardBackend]) -> RewardBackend:
        """The backend for `config`: the pool's, or a new one from `build` (started if it waits to
        be)."""
        return self.acquire_all([(config, build)])[0]

    def acquire_all(
        self, entries: Sequence[tuple[Any, Callable[[], RewardBackend]]]
    ) -> list[RewardBackend]:
        """The backend of each (config, build): the pool's, or a new one from `build`. The new ones
        are made and started at once (a panel's children boot together, its local models load
        together), under the lock, so two panels never start the same child twice and nobody sees
        one half started. If any fails (or Ctrl-C), none of the new ones is kept."""
        with self._lock:
            keys = [canonical_json(config) for config, _ in entries]
            builds: dict[bytes, Callable[[], RewardBackend]] = {}
            for key, (_, build) in zip(keys, entries, strict=True):
                if key not in self._backends and key not in builds:
                    builds[key] = build
            for key, backend in zip(builds, build_all(list(builds.values())), strict=True):
                self._backends[key] = (backend, 0)
            found = []
            for key in keys:
                backend, users = self._backends[key]
                self._backends[key] = (backend, users + 1)
                found.append(backend)
            return found

    def release(self, backend: RewardBackend) -> None:
        with self._lock:
            for key, (held, users) in list(self._backends.items()):
                if held is backend:
                    if users > 1:
                        self._backends[key] = (held, users - 1)
                        return
                    del self._backends[key]
                    break
            else:
                return
        backend.close()

    def __len__(self) -> int:
        return len(self._backends)


def _without_partial(error: BaseException) -> BaseException:
    """A term's ScorerItemsFailed as the panel raises it: a copy without the term's own rewards (its
    `partial` is that term's, never the panel's). Any other error as it is."""
    if not isinstance(error, ScorerItemsFailed):
        return error
    bare = copy.copy(error)
    bare.partial = None
    bare.__cause__, bare.__traceback__ = error.__cause__, error.__traceback__
    return bare
