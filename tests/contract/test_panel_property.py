"""Property: a RewardPanel's answer is the weighted sum, term by term and item by item, of what each
term's own scorer says about that very item, whatever the groups, their order, the chunk sizes,
the weights, the applicability and which terms fail.

Every term is an in-process LocalRewardBackend over `tests.helpers.fixture_scorers:Salted`, whose
value is a pure function of (salt, id) and which fails the whole call when its share of the request
holds one of its `poison` ids. Terms may share a backend (one call for all of them), as terms with
one backend configuration do. The expected answer is computed here from the scenario alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from supervisor import (
    LocalRewardBackend,
    PanelTerm,
    RewardItem,
    RewardPanel,
    RewardRequest,
    ScorerRequestError,
)
from tests.helpers.fixture_scorers import salted_value

DATASETS = ("math", "code", "chat")
TAGS = (*DATASETS, None)  # None: an item without a data_source tag
# dyadic weights: with Salted's k/1024 values every weighted sum of <= 4 terms is exact
WEIGHTS = (-2.0, -0.5, 0.0, 0.25, 1.0, 1.5, 3.0)


class RecordingBackend(LocalRewardBackend):
    """A LocalRewardBackend that records, per call, the ids of every chunk it scores (before scoring
    it)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.calls: list[list[list[str]]] = []
        super().__init__(*args, **kwargs)

    def score(self, request):  # type: ignore[no-untyped-def]
        self.calls.append([])
        return super().score(request)

    def score_chunk(self, chunk, group_size):  # type: ignore[no-untyped-def]
        self.calls[-1].append([item.id for item in chunk])
        return super().score_chunk(chunk, group_size)


@dataclass(frozen=True)
class Item:
    id: str
    group: str | None
    tag: str | None


@dataclass(frozen=True)
class Backend:
    salt: int
    poison: frozenset[str]
    batch: int


@dataclass(frozen=True)
class Term:
    name: str
    backend: int
    weight: float | dict[str, float]
    required: bool
    datasets: tuple[str, ...] | None
    component: str | None

    def applies(self, item: Item) -> bool:
        return self.datasets is None or item.tag in self.datasets


@dataclass(frozen=True)
class Scenario:
    items: list[Item]
    backends: list[Backend]
    terms: list[Term]


@st.composite
def scenarios(draw: st.DrawFn) -> Scenario:
    # groups: sizes 1-4, each with one data_source tag (a group's common inputs are identical)
    sizes = draw(st.lists(st.integers(1, 4), min_size=1, max_size=5))
    items = []
    for g, size in enumerate(sizes):
        grouped = size > 1 or draw(st.booleans())  # a lone item may have no group at all
        tag = draw(st.sampled_from(TAGS))
        items += [Item(f"g{g}i{j}", f"g{g}" if grouped else None, tag) for j in range(size)]
    if draw(st.booleans()):  # interleaved groups instead of contiguous ones
        items = draw(st.permutations(items))
    ids = [item.id for item in items]

    backends = []
    for _ in range(draw(st.integers(1, 3))):
        poison = (
            draw(st.sets(st.sampled_from(ids), min_size=1, max_size=2))
            if draw(st.booleans())
            else set()
        )
        backends.append(
            Backend(draw(st.integers(0, 10_000)), frozenset(poison), draw(st.integers(1, 6)))
        )

    terms = []
    for t in range(draw(st.integers(1, 4))):
        if draw(st.booleans()):
            weight: float | dict[str, float] = draw(st.sampled_from(WEIGHTS))
        else:  # per dataset, "*" for the rest; without "*" an unlisted dataset has no weight
            keys = draw(st.lists(st.sampled_from(DATASETS), unique=True, max_size=3))
            if not keys or draw(st.integers(0, 3)) > 0:
                keys.append("*")
            weight = {key: draw(st.sampled_from(WEIGHTS)) for key in keys}
        datasets = draw(
            st.none() | st.lists(st.sampled_from(DATASETS), unique=True, min_size=1).map(tuple)
        )
        terms.append(
            Term(
                name=f"t{t}",
                backend=draw(st.integers(0, len(backends) - 1)),
                weight=weight,
                required=draw(st.integers(0, 3)) == 0,  # mostly optional: failures get recorded
                datasets=datasets,
                component=draw(st.sampled_from((None, "salted"))),
            )
        )
    return Scenario(items, backends, terms)


def weight_of(term: Term, item: Item) -> float | None:
    """The term's weight for the item; None where the mapping has none (the panel must refuse)."""
    if not isinstance(term.weight, dict):
        return term.weight
    if item.tag is not None and item.tag in term.weight:
        return term.weight[item.tag]
    return term.weight.get("*")


def refusal(scenario: Scenario) -> tuple[str, str] | None:
    """(what, id) of the first item the panel must refuse before scoring anything."""
    for item in scenario.items:
        for term in scenario.terms:
            if term.applies(item) and weight_of(term, item) is None:
                return "has no weight", item.id
        if not any(term.applies(item) for term in scenario.terms):
            return "no term of the panel applies", item.id
    return None


def group_order(items: Sequence[Item]) -> list[list[str]]:
    """Ids by group, groups in order of first appearance (an ungrouped item is its own group)."""
    groups: dict[str, list[str]] = {}
    order: list[list[str]] = []
    for item in items:
        if item.group is None:
            order.append([item.id])
        elif item.group in groups:
            groups[item.group].append(item.id)
        else:
            groups[item.group] = [item.id]
            order.append(groups[item.group])
    return order


def check_chunks(chunks: list[list[str]], sent: list[Item], batch: int, complete: bool) -> None:
    """Chunks of at most `batch` items (a larger group alone), whole groups, in group order;
    together exactly the items sent when the call completed, a prefix of them when it failed."""
    groups = group_order(sent)
    flat = [item_id for chunk in chunks for item_id in chunk]
    expected = [item_id for group in groups for item_id in group]
    assert flat == (expected if complete else expected[: len(flat)])
    group_of = {item_id: tuple(group) for group in groups for item_id in group}
    for chunk in chunks:
        members = {group_of[item_id] for item_id in chunk}
        assert sum(map(len, members)) == len(chunk), f"chunk {chunk} splits a group"
        assert len(chunk) <= batch or len(members) == 1, f"chunk {chunk} is over {batch} items"


# two optional terms share a backend that fails: each records only the ids it applies to
SHARED_FAILURE = Scenario(
    items=[Item("a0", "a", "math"), Item("b0", None, "code"), Item("a1", "a", "math")],
    backends=[
        Backend(salt=1, poison=frozenset({"b0"}), batch=2),
        Backend(salt=2, poison=frozenset(), batch=1),
    ],
    terms=[
        Term("t0", 0, 1.0, False, ("math",), None),
        Term("t1", 0, {"*": 0.5}, False, ("code",), "salted"),
        Term("t2", 1, -2.0, True, None, None),
        # required, but applies to nothing here: not fatal
        Term("t3", 0, 1.0, True, ("chat",), None),
    ],
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
@example(SHARED_FAILURE)
def test_panel_reward_is_each_items_own_weighted_terms(scenario: Scenario) -> None:
    items, terms = scenario.items, scenario.terms
    backends = [
        RecordingBackend(
            "tests.helpers.fixture_scorers:Salted",
            {"salt": spec.salt, "poison": sorted(spec.poison)},
            request_batch_size=spec.batch,
        )
        for spec in scenario.backends
    ]
    panel = RewardPanel(
        [
            PanelTerm(
                name=term.name,
                backend=backends[term.backend],
                weight=term.weight,
                required=term.required,
                applicable_datasets=term.datasets,
                component=term.component,
            )
            for term in terms
        ]
    )
    request = RewardRequest(
        items=[
            RewardItem(id=item.id, group_id=item.group, data_source=item.tag, text=item.id)
            for item in items
        ]
    )
    try:
        refused = refusal(scenario)
        if refused is not None:
            what, item_id = refused
            event(f"refused: {what}")
            with pytest.raises(ScorerRequestError, match=what) as info:
                panel.compute_rewards(request)
            assert repr(item_id) in str(info.value) and info.value.kind == "bad_input"
            assert all(backend.calls == [] for backend in backends), "scored before refusing"
            return

        # what each backend is sent (items any of its terms applies to) and whether that call fails
        sent = {
            b: [item for item in items if any(t.applies(item) for t in terms if t.backend == b)]
            for b in set(term.backend for term in terms)
        }
        failed = {
            b
            for b, share in sent.items()
            if any(item.id in scenario.backends[b].poison for item in share)
        }

        def required_share(b: int) -> list[Item]:
            return [
                item
                for item in sent[b]
                if any(t.applies(item) for t in terms if t.backend == b and t.required)
            ]

        # a failed call whose optional terms brought items of their own is scored again for its
        # required terms' items alone: only their own failure is fatal
        retried = {b for b in failed if required_share(b) and len(required_share(b)) < len(sent[b])}
        fatal = any(
            any(item.id in scenario.backends[b].poison for item in required_share(b))
            for b in failed
        )

        def lost(term: Term) -> bool:
            """The term got no values: its backend's call failed and it was not recovered by the
            retry."""
            return term.backend in failed and not (term.required and term.backend in retried)

        event("fatal" if fatal else "optional failure recorded" if failed else "all scored")
        event(f"required share scored again: {bool(retried)}")
        event(f"terms sharing a backend: {len(terms) - len(sent) > 0}")
        if fatal:
            with pytest.raises(ScorerRequestError, match="is poison to salted"):
                panel.compute_rewards(request)
        else:
            response = panel.compute_rewards(request)
            assert response.ids == request.ids
            # lacks an optional term
            short = [any(lost(t) and t.applies(item) for t in terms) for item in items]
            assert response.successes == [not lacks for lacks in short]
            assert [error is not None for error in response.errors] == short
            expected_failures = {
                t.name: [item.id for item in items if t.applies(item)]
                for t in terms
                if lost(t) and any(map(t.applies, items))
            }
            assert {f.term: f.ids for f in response.term_failures} == expected_failures
            assert len(response.term_failures) == len(expected_failures)
            assert all(f.kind == "ScorerRequestError" for f in response.term_failures)
            for i, item in enumerate(items):
                total = 0.0
                for term in terms:
                    applies = term.applies(item)
                    assert response.applicable[term.name][i] is applies
                    value = response.component_rewards[term.name][i]
                    if not applies or lost(term):
                        assert value is None, (term.name, item.id)
                        continue
                    assert value == salted_value(scenario.backends[term.backend].salt, item.id), (
                        term.name,
                        item.id,
                    )
                    total += weight_of(term, item) * value  # type: ignore[operator]
                assert response.rewards[i] == total, item.id
            # diagnostics: one report per term that scored, counting the items its backend scored
            assert {
                term: report["sample_count"] for term, report in response.diagnostics.items()
            } == {
                t.name: len(required_share(t.backend) if t.backend in retried else sent[t.backend])
                for t in terms
                if not lost(t) and any(map(t.applies, items))
            }
        for b, backend in enumerate(backends):
            batch = scenario.backends[b].batch
            if not sent.get(b):  # none of its terms applies to any item: never called
                assert backend.calls == []
                continue
            check_chunks(backend.calls[0], sent[b], batch, complete=b not in failed)
            if b in retried:  # then its required share alone, whole unless that failed too (fatal)
                share = required_share(b)
                own_failure = any(item.id in scenario.backends[b].poison for item in share)
                check_chunks(backend.calls[1], share, batch, complete=not own_failure)
            assert len(backend.calls) == 1 + (b in retried)
    finally:
        panel.close()
        for backend in backends:
            backend.close()
