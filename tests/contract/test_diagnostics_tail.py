"""The tail's diagnostic kinds (`scorers.tail`): a latency histogram and the slowest items by id,
checked like any diagnostic, merged across chunks as counts are, and flattened for a logger."""

from __future__ import annotations

import time
from collections.abc import Sequence

import pytest

from scorers import tail
from scorers.base import ScoreItem, Scorer, ScoreResult, ScorerSpec
from scorers.diagnostics import DiagnosticsError, check_values, merge_values
from supervisor import LocalRewardBackend, RewardItem, RewardRequest
from supervisor.chunks import CHUNK_S, SLOWEST_CHUNKS
from supervisor.errors import RewardContractError


class Timed(Scorer):
    """len(text), and as its 'time' len(text) / 10 s: a histogram and the slowest items."""

    spec = ScorerSpec(
        name="timed", input_kind="text", env="image", diagnostics=("call_s", "slowest")
    )

    def __init__(self, bad: bool = False) -> None:
        self.bad = bad

    def score(self, items: Sequence[ScoreItem]) -> ScoreResult:
        seconds = [len(item.text or "") / 10 for item in items]
        top = tail.slowest(zip([item.id for item in items], seconds, strict=True), k=2)
        if self.bad:
            top["top"].append(["x", float("nan")])
        return ScoreResult(
            {"timed": [float(len(item.text or "")) for item in items]},
            diagnostics={"call_s": tail.histogram(seconds), "slowest": top},
        )


def test_histograms_and_slowest_items_merge_across_chunks_and_flatten_to_metrics():
    items = [RewardItem(id=f"i{n}", text="x" * n) for n in (1, 30, 2, 70, 5)]
    with LocalRewardBackend(Timed(), request_batch_size=2) as backend:
        response = backend.compute_rewards(RewardRequest(items=items))
    values = response.diagnostics["timed"]["values"]
    assert sum(values["call_s"]["counts"]) == 5  # three chunks' histograms added
    assert values["slowest"] == {"top": [["i70", 7.0], ["i30", 3.0]], "k": 2}  # across chunks
    metrics = response.metrics()
    assert metrics["train/reward/timed/call_s/count"] == 5.0
    assert metrics["train/reward/timed/call_s/p50"] == 0.5  # 0.5 s, the third of 0.1-7 s
    assert metrics["train/reward/timed/call_s/p99"] == 10.0  # 7 s
    assert metrics["train/reward/timed/slowest/max"] == 7.0
    assert tail.describe("slowest", values["slowest"]) == "slowest: i70 7 s, i30 3 s"
    with (
        LocalRewardBackend(Timed(bad=True)) as bad,
        pytest.raises(RewardContractError, match="top"),
    ):
        bad.compute_rewards(RewardRequest(items=items[:1]))


class Sleepy(Scorer):
    """1.0 for every item; a call with the item `slow` in it takes 0.2 s more. Times nothing."""

    spec = ScorerSpec(name="sleepy", input_kind="text", env="image")

    def score(self, items: Sequence[ScoreItem]) -> ScoreResult:
        if any(item.id == "slow" for item in items):
            time.sleep(0.2)
        return ScoreResult({"sleepy": [1.0] * len(items)})


def test_time_chunks_times_each_chunk_for_a_scorer_that_times_nothing():
    """`time_chunks`: each chunk's time as the caller saw it, a histogram and the slowest chunks
    named by their first id and size; off by default."""
    items = [RewardItem(id=name, text="x") for name in ("a", "b", "c", "slow", "e")]
    with LocalRewardBackend(Sleepy(), request_batch_size=2, time_chunks=True) as backend:
        response = backend.compute_rewards(RewardRequest(items=items))
    values = response.diagnostics["sleepy"]["values"]
    assert sum(values[CHUNK_S]["counts"]) == 3  # [a, b], [c, slow], [e]
    slowest = dict(values[SLOWEST_CHUNKS]["top"])
    assert set(slowest) == {"a (+1)", "c (+1)", "e"} and slowest["c (+1)"] >= 0.2
    assert response.metrics()[f"train/reward/sleepy/{CHUNK_S}/count"] == 3.0
    with LocalRewardBackend(Sleepy(), request_batch_size=2) as plain:
        assert (
            plain.compute_rewards(RewardRequest(items=items)).diagnostics["sleepy"]["values"] == {}
        )


def test_a_value_past_every_bound_is_said_so():
    line = tail.describe("call_s", tail.histogram([0.02, 0.02, 500.0]))
    assert line == "call_s: p50 <= 0.025 s, p95 > 120 s, p99 > 120 s over 3"


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ({"bounds": [1.0, 0.5], "counts": [0, 0, 0]}, "increasing"),
        ({"bounds": [1.0], "counts": [1]}, "one count more"),
        ({"top": [["a", 1.0]], "k": 0}, "k >= 1"),
        ({"top": [["a", 1.0], ["b", 2.0]], "k": 1}, "at most k"),
    ],
)
def test_malformed_tail_values_are_refused(value, why):
    with pytest.raises(DiagnosticsError, match=why):
        check_values("s", ["d"], {"d": value})


def test_kinds_that_differ_do_not_merge():
    with pytest.raises(DiagnosticsError, match="is a histogram in one report and a count"):
        merge_values([{"d": tail.histogram([1.0])}, {"d": 3}])
    with pytest.raises(DiagnosticsError, match="other bounds"):
        merge_values([{"d": tail.histogram([1.0])}, {"d": tail.histogram([1.0], (1.0, 2.0))}])
