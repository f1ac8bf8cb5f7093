"""UniRL's client-side reward: each required reward's sub-metrics reduced to one score
(`sub_metric_reduce`), then the rewards aggregated (`aggregation_method`, `reward_weights`), as
UniRL 0.2.0's `RemoteRewardBackend` computes them (unirl/reward/remote.py:
`_parse_score_response`, `_reduce_sub_metrics`, `_aggregate_scores`).

The drop-ins for UniRL's remote and managed backends use it, so a UniRL user who swaps `_target_`
gets the reward UniRL's own client gives against `serve`'s UniRL route. A reward's sub-metrics are
the ones that route answers (`child_runtime.protocol.unirl.answer`): a term, its value; the
scorer's name, its reward first, then each other term that has a value for the item. A reward
without a value for an item (a term that does not apply to its data source, or an optional term
that failed) counts as UniRL counts it, 0.0 in its component and left out of the aggregate, and its
`errors` entry names it; the item stays a success when the panel may use it (UniRL's own client
would flag it, and its RewardService would fail the step: an applicable-datasets panel could not
train).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from supervisor.errors import ConfigError
from supervisor.shape import ScorerShape
from supervisor.types import RewardResponse

METHODS = ("weighted_sum", "mean", "min", "max")
REDUCTIONS = ("first", "mean", "max")


@dataclass(frozen=True)
class Weighing:
    """UniRL's `reward_weights` (a reward not named weighs 1.0), `aggregation_method` and
    `sub_metric_reduce`, checked as UniRL checks them (a weight for a reward not required is
    refused too: it would weigh nothing)."""

    required: tuple[str, ...]
    weights: Mapping[str, float] = field(default_factory=dict)
    method: str = "weighted_sum"
    reduce: str = "first"

    @classmethod
    def of(cls, client: Mapping[str, Any], required: Sequence[str]) -> Weighing:
        weights = dict(client.get("reward_weights") or {})
        method = client.get("aggregation_method") or "weighted_sum"
        reduce = client.get("sub_metric_reduce") or "first"
        if method not in METHODS:
            raise ConfigError(f"aggregation_method must be one of {list(METHODS)}, got {method!r}")
        if reduce not in REDUCTIONS:
            raise ConfigError(
                f"sub_metric_reduce must be one of {list(REDUCTIONS)}, got {reduce!r}"
            )
        unknown = sorted(set(weights) - set(required))
        if unknown:
            raise ConfigError(
                f"reward_weights names {unknown}, not in required_rewards {list(required)}"
            )
        bad = {k: v for k, v in weights.items() if isinstance(v, bool) or not _finite(v)}
        if bad:
            raise ConfigError(f"reward_weights must be finite numbers, got {bad}")
        return cls(tuple(required), {k: float(v) for k, v in weights.items()}, method, reduce)

    def reduced(self, values: Sequence[float]) -> float:
        """One reward's sub-metrics as one score (UniRL's `_reduce_sub_metrics`)."""
        if self.reduce == "first":
            return float(values[0])
        if self.reduce == "mean":
            return float(sum(values) / len(values))
        return float(max(values))

    def aggregated(self, scores: Sequence[float], weights: Sequence[float]) -> float:
        """The rewards present for one item as one (UniRL's `_aggregate_scores`)."""
        if not scores:
            return 0.0
        if self.method == "weighted_sum":
            total = sum(weights)
            return (
                sum(s * w for s, w in zip(scores, weights, strict=True)) / total
                if total > 0
                else 0.0
            )
        if self.method == "mean":
            return sum(scores) / len(scores)
        return min(scores) if self.method == "min" else max(scores)


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def check_served(weighing: Weighing, shape: ScorerShape) -> None:
    """Every required reward is one the scorer answers (UniRL checks this against /health)."""
    served = {shape.name, *shape.terms}
    missing = [name for name in weighing.required if name not in served]
    if missing:
        raise ConfigError(
            f"required_rewards {missing} are not served by scorer {shape.name!r} "
            f"(served: {sorted(served)})"
        )


def sub_metrics(
    response: RewardResponse, shape: ScorerShape, reward: str, position: int
) -> list[float] | None:
    """`reward`'s sub-metrics for one item, as `serve`'s UniRL route answers them; None: no
    value."""
    components = response.component_rewards
    if reward in shape.terms:  # a term (or a scorer whose one term bears its name)
        value = components[reward][position]
        return None if value is None else [value]
    out = [response.rewards[position]]
    for term in shape.terms:
        column = components.get(term) if term != shape.reward_term else None
        other = None if column is None else column[position]
        if other is not None:
            out.append(other)
    return out


@dataclass
class Weighed:
    """UniRL's rewards, components, successes and errors for one response."""

    rewards: list[float]
    components: dict[str, list[float]]
    successes: list[bool]
    errors: list[str | None]


def weigh(weighing: Weighing, response: RewardResponse, shape: ScorerShape) -> Weighed:
    """UniRL's `_parse_score_response` over our response: per item, each required reward reduced,
    then aggregated; a reward without a value is 0.0 there and makes the item no success."""
    out = Weighed([], {name: [] for name in weighing.required}, [], [])
    usable = response.usable()
    for position in range(len(response.rewards)):
        scores, weights, missing = [], [], []
        for name in weighing.required:
            values = sub_metrics(response, shape, name, position)
            if values is None:
                out.components[name].append(0.0)
                missing.append(f"{name}: no value for this item (not applicable, or failed)")
                continue
            score = weighing.reduced(values)
            out.components[name].append(score)
            scores.append(score)
            weights.append(weighing.weights.get(name, 1.0))
        out.rewards.append(weighing.aggregated(scores, weights))
        out.successes.append(bool(scores) and usable[position])
        said = [response.errors[position], *missing]
        out.errors.append("; ".join(part for part in said if part) or None)
    return out
