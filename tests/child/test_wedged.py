"""The child's host and a wedged scorer (issue 37 item 4): once any scorer raises ScorerWedged (a call
left work running past its deadline on a thread it cannot stop), the host never calls it again: every
later call, wake or sleep is refused at once as never started, and close() leaves it alone. In-process."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from child_runtime.host import ScorerHost
from scorers.base import ScoreItem, Scorer, ScoreResult, ScorerSpec, ScorerWedged


class WedgesOnce(Scorer):
    spec = ScorerSpec(name="wedges", input_kind="text", terms=("wedges",), supports_offload=True)

    def __init__(self) -> None:
        self.calls: list[str] = []

    def score(self, items: Sequence[ScoreItem]) -> ScoreResult:
        self.calls.append("score")
        raise ScorerWedged("1 call still runs past its deadline")

    def onload(self) -> dict:
        self.calls.append("onload")
        return {}

    def offload(self) -> dict:
        self.calls.append("offload")
        return {}

    def close(self) -> None:
        self.calls.append("close")


@pytest.mark.parametrize("residency", ["resident", "per_call"])
def test_a_wedged_scorer_is_never_called_again(residency):
    scorer = WedgesOnce()
    host = ScorerHost(scorer, residency)
    if residency == "resident":
        host.onload()
        scorer.calls.clear()
    items = [ScoreItem(id="a", text="x")]
    with pytest.raises(ScorerWedged, match="still runs past its deadline") as first:
        host.score(items)
    assert first.value.timed_out and host.wedged == "1 call still runs past its deadline"
    assert scorer.calls == (["onload", "score"] if residency == "per_call" else ["score"])  # no sleep under it
    for refused in (lambda: host.score(items), host.onload, host.offload):
        with pytest.raises(ScorerWedged, match="never started: the scorer is wedged") as later:
            refused()
        assert not later.value.timed_out
    host.close(1.0)
    assert scorer.calls == (["onload", "score"] if residency == "per_call" else ["score"])
