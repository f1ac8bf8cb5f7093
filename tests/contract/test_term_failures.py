"""A scorer's failure of one term for one item (`ScoreResult.term_failed`): the item keeps its other
terms, the backend reports a TermFailure for that term, and a panel term on that component records
it when optional and raises when required (the contract native models' score functions use)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from scorers.base import ScoreItem, Scorer, ScorerContractError, ScoreResult, ScorerSpec, score_checked
from supervisor import LocalRewardBackend, RewardItem, RewardPanel, RewardRequest, ScorerItemsFailed
from supervisor.compose.panel import PanelTerm


class TwoTerms(Scorer):
    """`a` is 1.0 always; `b` is 2.0, and fails alone for an item whose text is "bad"."""

    spec = ScorerSpec(name="two_terms", input_kind="text", terms=("a", "b"))

    def score(self, items: Sequence[ScoreItem]) -> ScoreResult:
        broken = {i: "b broke" for i, item in enumerate(items) if item.text == "bad"}
        return ScoreResult(terms={"a": [1.0] * len(items), "b": [2.0] * len(items)}, term_failed={"b": broken})


def _request() -> RewardRequest:
    return RewardRequest(items=[RewardItem(id="x0", text="ok"), RewardItem(id="x1", text="bad")])


def test_a_backend_reports_one_terms_failure_and_keeps_the_items_other_terms():
    with LocalRewardBackend(TwoTerms()) as backend:
        got = backend.compute_rewards(_request())
    assert got.component_rewards == {"a": [1.0, 1.0], "b": [2.0, None]}
    assert got.rewards == [3.0, 1.0]  # the failed term adds nothing
    assert [(f.term, f.ids, f.error, f.kind) for f in got.term_failures] == [("b", ["x1"], "b broke", "term_failed")]
    assert got.successes == [True, False] and "term 'b' failed" in str(got.errors[1])


def test_a_panel_term_on_the_failed_component_records_it_if_optional_and_raises_if_required():
    backend = LocalRewardBackend(TwoTerms())
    terms = [PanelTerm("aa", backend, 1.0, True, component="a"), PanelTerm("bb", backend, 0.5, False, component="b")]
    with RewardPanel(terms, owns_backends=False) as panel:
        got = panel.compute_rewards(_request())
    assert got.component_rewards == {"aa": [1.0, 1.0], "bb": [2.0, None]} and got.rewards == [2.0, 1.0]
    assert [(f.term, f.ids) for f in got.term_failures] == [("bb", ["x1"])]
    required = [terms[0], PanelTerm("bb", backend, 0.5, True, component="b")]
    with RewardPanel(required, owns_backends=False) as panel:
        with pytest.raises(ScorerItemsFailed, match=r"required term 'bb' failed for 1 items: b broke"):
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
