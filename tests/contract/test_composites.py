"""What every backend answers about what it holds: members, leaves, whole groups, the call bound,
the ranks it scores over. One interface for leaves and composites, no attribute probing."""

from __future__ import annotations

from pathlib import Path

import pytest

from supervisor import (
    LocalRewardBackend,
    PanelTerm,
    RewardBackend,
    RewardItem,
    RewardPanel,
    RewardRequest,
    RewardResponse,
)
from supervisor.composition import component, leaf_shapes


class Bounded(LocalRewardBackend):
    """An in-process scorer that states a call bound, as a managed or remote backend does."""

    def __init__(self, bound_s: float) -> None:
        super().__init__("exact_match")
        self.bound_s = bound_s

    @property
    def call_bound_s(self) -> float:
        return self.bound_s


def test_a_leaf_holds_nothing_and_scores_alone():
    leaf = LocalRewardBackend("exact_match")
    assert leaf.members() == () and leaf.leaves() == [leaf]
    assert leaf.scoring_world == (0, 1) and leaf.call_bound_s is None
    assert leaf.needs_whole_groups() is False  # a pointwise scorer, no group size
    assert LocalRewardBackend("exact_match", group_size=4).needs_whole_groups() is True
    assert leaf.fail_step(ValueError("bad prompt"), step=3) is None  # alone: nobody to tell


def test_a_panel_lists_its_backends_once_and_answers_for_them():
    exact = LocalRewardBackend("exact_match")
    groupwise = LocalRewardBackend("pairwise_judge", {"inner": "token_f1"})
    slow, quick = Bounded(7.5), Bounded(2.0)
    panel = RewardPanel(
        [
            PanelTerm("a", exact),
            PanelTerm("b", exact, weight=0.5),
            PanelTerm("c", slow, required=False),
        ]
        + [PanelTerm("d", quick)],
        owns_backends=False,
    )
    assert panel.members() == [exact, slow, quick]  # exact scores two terms: held once
    assert panel.leaves() == [exact, slow, quick]
    assert panel.call_bound_s == 7.5  # the slowest bound inside
    assert panel.needs_whole_groups() is True  # an optional term's failure must cover whole groups
    inner = RewardPanel([PanelTerm("x", exact)], owns_backends=False)
    nested = RewardPanel([PanelTerm("inner", inner)], owns_backends=False)
    assert (
        nested.members() == [inner]
        and nested.leaves() == [exact]
        and nested.needs_whole_groups() is False
    )
    grouped = RewardPanel(
        [PanelTerm("inner", inner), PanelTerm("f1", groupwise)], owns_backends=False
    )
    # pairwise_judge compares a group's candidates
    assert grouped.leaves() == [exact, groupwise] and grouped.needs_whole_groups() is True
    # token_f1 is groupwise too, but scores each candidate on its own (map_candidates)
    per_candidate = RewardPanel(
        [PanelTerm("inner", inner), PanelTerm("f1", LocalRewardBackend("token_f1"))]
    )
    with per_candidate:
        assert per_candidate.needs_whole_groups() is False
    with pytest.raises(ValueError, match="step"):
        RewardRequest(items=[RewardItem(id="a", text="1")], step=-1)


def test_the_trainer_contract_has_ten_names_and_the_docs_list_each():
    names = sorted(name for name in dir(RewardBackend) if not name.startswith("_"))
    assert len(names) <= 10, names
    concepts = (Path(__file__).resolve().parents[2] / "docs" / "concepts.md").read_text()
    assert [
        name for name in names if f"`{name}(" not in concepts and f"`await {name}(" not in concepts
    ] == []


def test_a_trainers_own_backend_answers_as_a_leaf_of_an_unknown_scorer():
    class Own(RewardBackend):
        def compute_rewards(self, request: RewardRequest) -> RewardResponse:
            raise NotImplementedError

    own = Own()
    seen = component(own)
    assert seen.leaves() == [own] and seen.shape is None and seen.identity_hash is None
    assert seen.needs_whole_groups() is True  # its scorer may be groupwise
    assert leaf_shapes(own) == [] and seen.scoring_world == (0, 1)
