"""pairwise_judge: a comparative group scorer over any pointwise inner scorer.

Each candidate is scored by the inner scorer, then compared with every other candidate
of its group: its reward is its win rate (a tie counts half), so it says how a
completion ranks among its siblings, whatever the inner scorer's scale. This is a
judge's verdict on the group, not GRPO's advantage normalisation (no mean or std is
taken; the trainer still normalises the rewards it gets).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from scorers.base import ScoreItem, ScoreResult, ScorerSpec, score_checked
from scorers.diagnostics import mean
from scorers.groups import GroupContext
from scorers.wrapping import WrappingScorer


class PairwiseJudge(WrappingScorer):
    """Win rate of each candidate against the rest of its group, judged by `inner`'s score."""

    # per instance
    spec = ScorerSpec(name="pairwise_judge", input_kind="text", groupwise=True, terms=("win_rate",))

    def __init__(
        self, inner: str, inner_params: Mapping[str, Any] | None = None, margin: float = 0.0
    ) -> None:
        if isinstance(margin, bool) or not isinstance(margin, (int, float)) or not margin >= 0:
            raise ValueError(f"pairwise_judge: margin must be a number >= 0, got {margin!r}")
        super().__init__(inner, inner_params)
        inner_spec = self.inner.spec
        if inner_spec.groupwise and not inner_spec.ragged_groups:
            raise ValueError(
                f"pairwise_judge: inner scorer {inner!r} must score candidates one by one"
            )
        if len(inner_spec.term_names()) != 1:
            raise ValueError(
                f"pairwise_judge: inner scorer {inner!r} has terms "
                f"{inner_spec.term_names()}; use one"
            )
        self.margin = float(margin)
        self.spec = self.wrapped_spec(
            name="pairwise_judge",
            revision_prefix="pairwise-1",
            input_kind=inner_spec.input_kind,
            required_fields=inner_spec.required_fields,
            terms=("win_rate",),
            diagnostics=("ties", "inner_score"),
            groupwise=True,
        )

    def score_group(self, candidates: Sequence[ScoreItem], context: GroupContext) -> ScoreResult:
        (inner,) = score_checked(self.inner, candidates).terms.values()
        wins, ties = [], 0
        for i, mine in enumerate(inner):
            total = 0.0
            for j, theirs in enumerate(inner):
                if i == j:
                    continue
                if abs(mine - theirs) <= self.margin:
                    total += 0.5
                    ties += 1
                elif mine > theirs:
                    total += 1.0
            wins.append(total / (len(inner) - 1) if len(inner) > 1 else 0.5)
        return ScoreResult(
            terms={"win_rate": wins},
            diagnostics={"ties": ties // 2, "inner_score": mean(sum(inner), len(inner))},
        )
