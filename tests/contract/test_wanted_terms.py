"""A request may name the terms it wants (`"terms"` on the wire): the result holds exactly those."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from child_runtime.protocol.items import RequestError, request_terms
from scorers.base import (
    ScoreInputError,
    ScoreItem,
    Scorer,
    ScorerContractError,
    ScoreResult,
    ScorerSpec,
    score_checked,
)
from tests.helpers.fixture_scorers import TwoTermImage

IMAGE = np.zeros((2, 2, 3), dtype=np.uint8)


class Selective(Scorer):
    """Scores only what it is asked for, and says which calls it got."""

    spec = ScorerSpec(name="selective", input_kind="text", terms=("a", "b", "c"), env="image")

    def __init__(self) -> None:
        self.asked: list[tuple[str, ...] | None] = []

    def score(self, items: Sequence[ScoreItem]) -> ScoreResult:
        self.asked.append(None)
        return ScoreResult(terms={t: [1.0] * len(items) for t in ("a", "b", "c")})

    def score_terms(self, items: Sequence[ScoreItem], terms: tuple[str, ...]) -> ScoreResult:
        self.asked.append(terms)
        return ScoreResult(
            terms={t: [2.0] * len(items) for t in terms},
            term_failed={"a": {0: "no"}} if "a" in terms else {},
        )


def test_a_scorer_that_cannot_skip_work_scores_all_and_the_rest_is_dropped():
    items = [ScoreItem(id="x", image=IMAGE)]
    result = score_checked(TwoTermImage(), items, terms=["penalty"])
    assert result.terms == {"penalty": [-5.0]}
    assert set(score_checked(TwoTermImage(), items).terms) == {"aesthetic", "penalty"}


def test_a_selective_scorer_is_asked_for_exactly_those_terms_and_its_failures_stay_per_term():
    scorer, items = Selective(), [ScoreItem(id="x", text="t"), ScoreItem(id="y", text="u")]
    result = score_checked(scorer, items, terms=["c", "a"])
    assert scorer.asked == [("c", "a")] and list(result.terms) == ["c", "a"]
    assert (
        result.term_failed == {"a": {0: "no"}}
        and np.isnan(result.terms["a"][0])
        and result.terms["c"] == [2.0, 2.0]
    )


@pytest.mark.parametrize("terms", [["nope"], [], ["a", "a"]])
def test_an_unknown_empty_or_repeated_selection_is_the_requests_fault(terms):
    with pytest.raises(ScoreInputError, match="asked of scorer 'selective'"):
        score_checked(Selective(), [ScoreItem(id="x", text="t")], terms=terms)


def test_a_scorer_that_leaves_out_a_term_asked_for_breaks_the_contract():
    class Forgets(Selective):
        def score_terms(self, items: Sequence[ScoreItem], terms: tuple[str, ...]) -> ScoreResult:
            return ScoreResult(terms={"a": [1.0] * len(items)})

    with pytest.raises(ScorerContractError, match="asked for"):
        score_checked(Forgets(), [ScoreItem(id="x", text="t")], terms=["a", "b"])


def test_the_wire_field_is_a_list_of_names_or_absent():
    assert request_terms({"items": []}) is None
    assert request_terms({"items": [], "terms": ["a"]}) == ["a"]
    for bad in ("a", [1], [""]):
        with pytest.raises(RequestError, match="request.terms"):
            request_terms({"items": [], "terms": bad})
