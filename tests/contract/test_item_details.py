"""Per-item details (`scorers.details`): what a scorer says of one item stays with that item's id
through chunks, groups, shares, panels and a served panel, and only a small JSON object over the
declared keys crosses: reporting only, never a reward. The wire and the fronts are tested with a
real child in tests/scorers/test_code_exec_managed.py and tests/ops/test_code_exec_fronts.py."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from scorers.base import ScoreItem, Scorer, ScoreResult, ScorerSpec
from scorers.details import MAX_BYTES
from supervisor import LocalRewardBackend, PanelTerm, RewardItem, RewardPanel, RewardRequest
from supervisor.errors import RewardContractError
from supervisor.joined import join_rows, rows_by_id
from supervisor.ops.panel_scorer import as_result
from supervisor.shape import ScorerShape
from supervisor.types import RewardResponse
from supervisor.verify import verify_score_answer


class Says(Scorer):
    """len(text); says of each item its text and the size of the chunk it came in. `said` replaces
    what it says (a misbehaving scorer)."""

    spec = ScorerSpec(
        name="says", input_kind="text", terms=("says",), env="image", details=("text", "chunk")
    )

    def __init__(self, said: object = None, groupwise: bool = False) -> None:
        self.said = said
        if groupwise:
            self.spec = ScorerSpec(**{**vars(Says.spec), "groupwise": True})

    def score(self, items: Sequence[ScoreItem]) -> ScoreResult:
        return ScoreResult(
            terms={"says": [float(len(item.text or "")) for item in items]},
            details={
                i: {"text": item.text, "chunk": len(items)} if self.said is None else self.said
                for i, item in enumerate(items)
            },
        )

    def score_group(self, candidates, context):  # type: ignore[no-untyped-def]
        return self.score(candidates)


def _request(count: int, groups: int | None = None) -> RewardRequest:
    return RewardRequest(
        items=[
            RewardItem(id=f"i{n}", text="x" * n, group_id=None if groups is None else f"g{n % 2}")
            for n in range(count)
        ]
    )


def test_details_stay_with_their_ids_across_chunks_and_groups():
    with LocalRewardBackend(Says(), request_batch_size=2) as chunked:
        response = chunked.compute_rewards(_request(5))
    assert response.details == {
        "says": {f"i{n}": {"text": "x" * n, "chunk": 1 if n == 4 else 2} for n in range(5)}
    }
    assert response.details_for("i3") == {"says": {"text": "xxx", "chunk": 2}}
    with LocalRewardBackend(Says(groupwise=True), group_size=2) as grouped:
        request = RewardRequest(
            items=[RewardItem(id=f"i{n}", text="x" * n, group_id=f"g{n % 2}") for n in range(4)]
        )
        said = grouped.compute_rewards(request).details["says"]
    # groups g0 = (i0, i2), g1 = (i1, i3): each said of by its own group's call, put back by id
    assert {item_id: said[item_id]["text"] for item_id in said} == {
        f"i{n}": "x" * n for n in range(4)
    }


@pytest.mark.parametrize(
    ("said", "why"),
    [
        ({"score": 1}, "undeclared key 'score'"),
        ({"text": "x" * MAX_BYTES}, f"limit {MAX_BYTES}"),
        ({"text": float("nan")}, "not finite UTF-8 JSON"),
        ({"text": object()}, "not finite UTF-8 JSON"),
        (["text"], "must be a mapping"),
    ],
)
def test_details_that_break_the_contract_fail_the_call(said, why):
    with LocalRewardBackend(Says(said)) as backend:
        with pytest.raises(RewardContractError, match=why):
            backend.compute_rewards(_request(2))


def test_an_answer_s_details_are_checked_against_the_request_and_the_declared_keys():
    shape = ScorerShape("says", ("says",), details=("text",))
    answer = {"ids": ["a", "b"], "terms": {"says": np.array([1.0, 2.0])}}
    checked = verify_score_answer({**answer, "details": {"b": {"text": "hi"}}}, ["a", "b"],
                                  ["says"], declared=shape)  # fmt: skip
    assert checked.details == {"b": {"text": "hi"}}
    for details, why in (
        ({"c": {"text": "hi"}}, "ids \\['c'\\] that were not in the request"),
        ({"a": {"chunk": 2}}, "undeclared key 'chunk'"),
        (["a"], "must map ids to objects"),
    ):
        with pytest.raises(RewardContractError, match=why):
            verify_score_answer({**answer, "details": details}, ["a", "b"], ["says"],
                                declared=shape)  # fmt: skip
    with pytest.raises(ValueError, match="not the items'"):
        RewardResponse(ids=["a"], rewards=[1.0], component_rewards={},
                       details={"says": {"z": {"text": "hi"}}})  # fmt: skip


def test_joined_shares_and_panels_keep_each_item_s_details_under_its_term():
    with LocalRewardBackend(Says()) as backend:
        first = backend.compute_rewards(_request(2))
        second = backend.compute_rewards(RewardRequest(items=[RewardItem(id="i9", text="y")]))
        joined = join_rows(["i9", "i1"], rows_by_id([first, second]), {})
        assert joined.details == {
            "says": {"i9": {"text": "y", "chunk": 1}, "i1": {"text": "x", "chunk": 2}}
        }
        inner = RewardPanel([PanelTerm("length", backend)], owns_backends=False)
        outer = RewardPanel([PanelTerm("inner", inner), PanelTerm("own", backend, weight=0.0)],
                            owns_backends=False)  # fmt: skip
        response = outer.compute_rewards(_request(2))
    assert response.details == {
        "inner": {f"i{n}": {"text": "x" * n, "chunk": 2} for n in range(2)},
        "own": {f"i{n}": {"text": "x" * n, "chunk": 2} for n in range(2)},
    }
    # a served panel answers an item's details by term (its scorer declares its terms as keys)
    result = as_result(response, ["inner", "own"])
    assert result.details[1] == {
        "inner": {"text": "x", "chunk": 2},
        "own": {"text": "x", "chunk": 2},
    }
