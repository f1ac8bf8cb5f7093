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

from scorers.base import ScoreItem, Scorer, ScoreResult, ScorerSpec, score_checked
from scorers.diagnostics import mean
from scorers.groups import GroupContext
from scorers.identity import scorer_document
from scorers.registry import resolve_scorer


class PairwiseJudge(Scorer):
    """Win rate of each candidate against the rest of its group, judged by `inner`'s score."""

    spec = ScorerSpec(name="pairwise_judge", input_kind="text", groupwise=True, terms=("win_rate",))  # per instance

    def __init__(self, inner: str, inner_params: Mapping[str, Any] | None = None, margin: float = 0.0) -> None:
        if isinstance(margin, bool) or not isinstance(margin, (int, float)) or not margin >= 0:
            raise ValueError(f"pairwise_judge: margin must be a number >= 0, got {margin!r}")
        self.inner_params = dict(inner_params or {})
        self.inner = resolve_scorer(inner)(**self.inner_params)
        inner_spec = self.inner.spec
        if inner_spec.groupwise and not inner_spec.ragged_groups:
            raise ValueError(f"pairwise_judge: inner scorer {inner!r} must score candidates one by one")
        if len(inner_spec.term_names()) != 1:
            raise ValueError(f"pairwise_judge: inner scorer {inner!r} has terms {inner_spec.term_names()}; use one")
        self.margin = float(margin)
        self.spec = ScorerSpec(
            name="pairwise_judge",
            input_kind=inner_spec.input_kind,
            required_fields=inner_spec.required_fields,
            terms=("win_rate",),
            revision=f"pairwise-1[{inner_spec.name}@{inner_spec.revision}]",
            env=inner_spec.env,
            supports_offload=inner_spec.supports_offload,
            report_packages=inner_spec.report_packages,
            writable_inputs=inner_spec.writable_inputs,
            diagnostics=("ties", "inner_score"),
            identity={"inner": scorer_document(self.inner, self.inner_params)},
            groupwise=True,
            requires_modules=inner_spec.requires_modules,
        )

    def load(self, device: str = "cpu") -> None:
        self.inner.load(device)

    def onload(self) -> dict[str, Any]:
        return self.inner.onload()

    def offload(self) -> dict[str, Any]:
        return self.inner.offload()

    def close(self) -> None:
        self.inner.close()

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
