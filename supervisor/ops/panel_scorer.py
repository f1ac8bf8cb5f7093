"""A whole reward panel as one Scorer, so `managed-scorers serve --recipe` is the child runtime's
own server (token, limits, gate, /health, /metrics, graceful stop, OpenRLHF's route) over a panel.

It runs in the trainer env's python (the server process), never in a scorer env: `load()` builds the
recipe's training panel, whose children (each in its own env) start together and are the server's
own (their lifeline watches it). Its terms are the panel's terms (each item's value of that term,
unweighted) and `WEIGHTED` (the panel's weighted reward, `spec.reward_term`). A request naming
terms (`"terms"` on the wire) gets a panel of those terms only: the others are not scored and the
weighted reward sums only them (UniRL's `required_rewards`). Its identity is known once loaded (its
terms' identities come from their children): `load()` sets it, the runtime hashes it then.

A term's failure is answered as what it is: the request's fault (a 422), the scorer's own refusal (a
500 a client never retries elsewhere), or this server's fault (a term's child that died, timed out,
cannot start or wake its model: `ServerFault`, a 503 a client of several servers fails over on). It
is warming while any term's backend is (a math child's grading workers), so serve says ready after.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from child_runtime.protocol.wire import RESIDENCY_FAILED
from scorers import item_fields
from scorers.base import ScoreInputError, ScoreItem, Scorer, ScoreResult, ScorerSpec, ServerFault
from supervisor.compose.panel import RewardPanel
from supervisor.compose.recipes import build_panel, load_recipe
from supervisor.config import PanelConfig
from supervisor.errors import (
    ConfigError,
    ScorerProcessDied,
    ScorerRequestError,
    ScorerStartupError,
    ScorerTimeout,
    ScorerUnavailable,
)
from supervisor.types import RewardItem, RewardRequest, RewardResponse

NAME = "panel"
WEIGHTED = "weighted_reward"  # the term that carries the panel's own reward
CONCURRENT_CALLS = 4  # a request's chunks overlap: each backend serialises its own calls anyway
# A term's failure that is this server's: its child died (a crash loop too), passed its deadline,
# cannot start, or a server it calls cannot be reached. Another server of the panel may score the
# request.
SERVER_FAULTS = (ScorerProcessDied, ScorerTimeout, ScorerStartupError, ScorerUnavailable)
# a remote term's server said: try later or elsewhere
UPSTREAM_RETRY_STATUSES = (429, 502, 503, 504)


def _input_kind(config: PanelConfig) -> str:
    """The kind every term takes, or "mixed" (then no completion field is required up front: each
    term's backend checks its own)."""
    kinds = {
        getattr(getattr(term.backend, "client", None), "input_kind", "text")
        for term in config.terms
    }
    return str(kinds.pop()) if len(kinds) == 1 else "mixed"


def reward_item(item: ScoreItem) -> RewardItem:
    """A decoded wire item back as the trainer's item (the panel's backends take those): every
    declared field."""
    return RewardItem(**{name: getattr(item, name) for name in item_fields.NAMES})


class PanelScorer(Scorer):
    """The training panel of the recipe at `recipe` (a path), served as one scorer."""

    def __init__(self, recipe: str) -> None:
        self.recipe = str(Path(recipe).resolve())
        try:
            self.config = load_recipe(self.recipe).train  # parses only: nothing starts here
        except ConfigError as exc:
            raise ValueError(str(exc)) from exc
        names = tuple(term.name for term in self.config.terms)
        if WEIGHTED in names:
            raise ValueError(
                f"a served panel's term may not be named {WEIGHTED!r}: that name carries its reward"
            )
        self.spec = ScorerSpec(
            name=NAME,
            input_kind=_input_kind(self.config),
            terms=(*names, WEIGHTED),
            details=names,  # an item's details: {term: what that term's scorer said of it}
            revision="panel-1",
            env="trainer",
            supports_offload=True,
            # where the recipe lies is not what it means: the identity is
            nonsemantic_params=("recipe",),
            concurrent_calls=CONCURRENT_CALLS,
            reward_term=WEIGHTED,
        )
        self.panel: RewardPanel | None = None
        self._subsets: dict[tuple[str, ...], RewardPanel] = {}
        self._lock = threading.Lock()
        self._offloaded = False

    def load(self, device: str = "cpu") -> None:
        """Start every term's backend (children together); then the identity is known."""
        panel = self.panel = build_panel(self.config)
        described = [term.describe() for term in panel.terms]
        self.spec = replace(self.spec, identity={"panel": panel.identity_hash, "terms": described})

    def warming(self) -> bool:
        """Any term's backend still warming (a math child's grading workers): serve says ready
        after."""
        panel = self.panel
        return panel is not None and panel.warming()

    def _serving(self) -> RewardPanel:
        if self.panel is None:
            raise RuntimeError("the panel scorer is not loaded")
        return self.panel

    def _subset(self, terms: tuple[str, ...]) -> RewardPanel:
        """The panel of only `terms`, on the same backends (made once per subset asked for)."""
        panel = self._serving()
        wanted = tuple(term for term in terms if term != WEIGHTED)
        if not wanted or set(wanted) == {term.name for term in panel.terms}:
            return panel
        with self._lock:
            if wanted not in self._subsets:
                kept = [term for term in panel.terms if term.name in wanted]
                self._subsets[wanted] = RewardPanel(
                    kept,
                    owns_backends=False,
                    group_size=panel.group_size,
                    group_failures=panel.group_failures,
                )
            return self._subsets[wanted]

    def score(self, items: Sequence[ScoreItem]) -> ScoreResult:
        return self.score_request(items, None, None)

    def score_terms(self, items: Sequence[ScoreItem], terms: tuple[str, ...]) -> ScoreResult:
        return self.score_request(items, None, terms)

    def score_request(
        self, items: Sequence[ScoreItem], group_size: int | None, terms: tuple[str, ...] | None
    ) -> ScoreResult:
        """The request's group size goes to the panel (its groupwise terms check and regroup by it;
        the recipe's own `group_size` refuses a request declaring another)."""
        panel = self._serving() if terms is None else self._subset(terms)
        try:
            request = RewardRequest(
                items=[reward_item(item) for item in items], group_size=group_size
            )
        except ValueError as exc:
            raise ScoreInputError(f"an item the panel cannot take: {exc}") from exc
        try:
            response = panel.compute_rewards(request)
        except ScorerRequestError as exc:
            # the request's fault (no term applies, a group broken): a 422
            if exc.kind == "bad_input":
                raise ScoreInputError(str(exc)) from exc
            if server_fault(exc):
                raise ServerFault(_failed_term(exc)) from exc
            raise
        except SERVER_FAULTS as exc:
            raise ServerFault(_failed_term(exc)) from exc
        return as_result(response, [term.name for term in panel.terms])

    def onload(self) -> dict[str, Any]:
        """At boot a no-op (load() left each backend as its config says); after an offload, wakes
        them."""
        if not self._offloaded:
            return {}
        figures = self._serving().onload()
        self._offloaded = False
        return figures

    def offload(self) -> dict[str, Any]:
        figures = self._serving().offload()
        self._offloaded = True
        return figures

    def close(self) -> None:
        """Every term's backend closed: the panel's children stopped (bounded by their shutdown)."""
        panel, self.panel = self.panel, None
        if panel is not None:
            panel.close()


def server_fault(error: ScorerRequestError) -> bool:
    """A term's answered failure that is this server's, not the request's: a model its child could
    not wake or put to sleep, or a server the term calls that said try later or elsewhere."""
    return error.kind == RESIDENCY_FAILED or error.status in UPSTREAM_RETRY_STATUSES


def _failed_term(error: BaseException) -> str:
    """The panel's note (which term, why it is fatal) and the term's error, for the client."""
    notes = "; ".join(getattr(error, "__notes__", ()))
    return f"a term of the panel failed on this server ({notes}): {type(error).__name__}: {error}"


def as_result(response: RewardResponse, names: Sequence[str]) -> ScoreResult:
    """The panel's response as its scorer's result: each term's values, the items it does not apply
    to (`not_applicable`: None on the client's side too), its optional failures as that term's
    `term_failed`, the weighted reward, and each item's details by term."""
    position = {item_id: index for index, item_id in enumerate(response.ids)}
    term_failed: dict[str, dict[int, str]] = {}
    for failure in response.term_failures:
        if failure.term in names:
            term_failed.setdefault(failure.term, {}).update(
                {position[i]: failure.error or failure.kind for i in failure.ids}
            )
    terms: dict[str, list[float]] = {}
    not_applicable: dict[str, set[int]] = {}
    for name in names:
        mask = response.applicable.get(name)
        if mask is not None and not all(mask):
            not_applicable[name] = {index for index, applies in enumerate(mask) if not applies}
        terms[name] = [
            math.nan if value is None else value for value in response.component_rewards[name]
        ]
    terms[WEIGHTED] = list(response.rewards)
    details: dict[int, dict[str, Any]] = {}
    for name, said in response.details.items():
        term, _, inner = name.partition(".")  # a panel inside: its terms' under this term
        for item_id, detail in said.items():
            mine = details.setdefault(position[item_id], {})
            if inner:
                mine.setdefault(term, {})[inner] = detail
            else:
                mine[term] = detail
    return ScoreResult(
        terms=terms, term_failed=term_failed, not_applicable=not_applicable, details=details
    )
