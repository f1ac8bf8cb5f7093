"""A scorer's failure of one term for one item (`ScoreResult.term_failed`): the item keeps its other
terms, the backend reports a TermFailure for that term, and a panel term on that component records
it when optional and raises when required (the contract native models' score functions use)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from scorers.base import (
    ScoreItem,
    Scorer,
    ScorerContractError,
    ScoreResult,
    ScorerSpec,
    score_checked,
)
from supervisor import (
    LocalRewardBackend,
    RewardItem,
    RewardPanel,
    RewardRequest,
    RewardService,
    ScorerItemsFailed,
)
from supervisor.compose.panel import PanelTerm
from supervisor.errors import ScorerTermsFailed
from supervisor.types import SCORER_TERM_FAILED


class TwoTerms(Scorer):
    """`a` is 1.0 always; `b` is 2.0, and fails alone for an item whose text is "bad"."""

    spec = ScorerSpec(name="two_terms", input_kind="text", terms=("a", "b"))

    def score(self, items: Sequence[ScoreItem]) -> ScoreResult:
        broken = {i: "b broke" for i, item in enumerate(items) if item.text == "bad"}
        return ScoreResult(
            terms={"a": [1.0] * len(items), "b": [2.0] * len(items)}, term_failed={"b": broken}
        )


def _request() -> RewardRequest:
    return RewardRequest(items=[RewardItem(id="x0", text="ok"), RewardItem(id="x1", text="bad")])


def test_a_backend_alone_raises_a_terms_failure_never_a_reward_summed_without_the_term():
    """Nothing below a panel knows whether the term was optional: the caller gets the error, whose
    response keeps every item's other terms (for a panel to take)."""
    with LocalRewardBackend(TwoTerms()) as backend:
        with pytest.raises(
            ScorerTermsFailed, match=r"failed terms \['b'\] for 1 items: 'x1': term 'b': b broke"
        ) as caught:
            backend.compute_rewards(_request())
        with pytest.raises(ScorerTermsFailed):  # RewardService is no way around it
            RewardService(backend).score_and_attach(_request().items)
    got = caught.value.response
    assert got.component_rewards == {"a": [1.0, 1.0], "b": [2.0, None]} and caught.value.failed == {
        "x1": "term 'b': b broke"
    }
    assert [(f.term, f.ids, f.error, f.kind) for f in got.term_failures] == [
        ("b", ["x1"], "b broke", SCORER_TERM_FAILED)
    ]
    assert got.usable() == [True, False]  # a scorer's own term failure is not an optional term's


def test_a_panel_term_on_the_whole_reward_of_such_a_backend_records_it_if_optional_and_raises_if_required():  # noqa: E501
    backend = LocalRewardBackend(TwoTerms())
    terms = [
        PanelTerm("ok", LocalRewardBackend("constant"), 1.0, True),
        PanelTerm("both", backend, 1.0, False),
    ]
    with RewardPanel(terms, owns_backends=False) as panel:
        got = panel.compute_rewards(_request())
    assert got.component_rewards == {"ok": [1.0, 1.0], "both": [3.0, None]} and got.rewards == [
        4.0,
        1.0,
    ]
    assert [(f.term, f.ids, f.kind) for f in got.term_failures] == [("both", ["x1"], "term_failed")]
    assert got.usable() == [True, True]  # short of an optional panel term only
    with RewardPanel(
        [terms[0], PanelTerm("both", backend, 1.0, True)], owns_backends=False
    ) as panel:
        with pytest.raises(
            ScorerItemsFailed, match=r"required term 'both' failed for 1 items: b broke"
        ):
            panel.compute_rewards(_request())
    terms[0].backend.close()
    backend.close()


def test_a_panel_term_on_the_failed_component_records_it_if_optional_and_raises_if_required():
    backend = LocalRewardBackend(TwoTerms())
    terms = [
        PanelTerm("aa", backend, 1.0, True, component="a"),
        PanelTerm("bb", backend, 0.5, False, component="b"),
    ]
    with RewardPanel(terms, owns_backends=False) as panel:
        got = panel.compute_rewards(_request())
    assert got.component_rewards == {"aa": [1.0, 1.0], "bb": [2.0, None]} and got.rewards == [
        2.0,
        1.0,
    ]
    assert [(f.term, f.ids) for f in got.term_failures] == [("bb", ["x1"])]
    required = [terms[0], PanelTerm("bb", backend, 0.5, True, component="b")]
    with RewardPanel(required, owns_backends=False) as panel:
        with pytest.raises(
            ScorerItemsFailed, match=r"required term 'bb' failed for 1 items: b broke"
        ):
            panel.compute_rewards(_request())
    backend.close()


def test_term_failed_may_name_only_declared_terms_and_real_positions():
    class Wrong(TwoTerms):
        def score(self, items: Sequence[ScoreItem]) -> ScoreResult:
            return ScoreResult(terms={"a": [1.0], "b": [1.0]}, term_failed={"c": {0: "?"}})

    with pytest.raises(ScorerContractError, match="term_failed must map its terms"):
        score_checked(Wrong(), [ScoreItem(id="x", text="t")])

    class Outside(TwoTerms):
        def score(self, items: Sequence[ScoreItem]) -> ScoreResult:
            return ScoreResult(terms={"a": [1.0], "b": [1.0]}, term_failed={"b": {3: "?"}})

    with pytest.raises(ScorerContractError, match=r"term_failed\['b'\] must map item positions"):
        score_checked(Outside(), [ScoreItem(id="x", text="t")])


def test_a_failed_term_outside_the_reward_leaves_the_reward_usable():
    """A served panel's optional component, say: the reward (here `a` alone) stands without it."""
    with LocalRewardBackend(TwoTerms(), required_rewards=["a"]) as backend:
        got = backend.compute_rewards(_request())
    assert got.rewards == [1.0, 1.0] and got.component_rewards["b"] == [2.0, None]
    assert [(f.term, f.ids, f.kind) for f in got.term_failures] == [("b", ["x1"], "term_failed")]
    assert got.usable() == [True, True] and got.successes == [True, False]
