"""The child's host and a wedged scorer (issue 37 item 4): once any scorer raises ScorerWedged (a
call left work running past its deadline on a thread it cannot stop), the host never calls it again:
every later call, wake or sleep is refused at once as never started, and close() leaves it alone.
In-process."""

from __future__ import annotations

import sys
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
    # no sleep under it
    assert scorer.calls == (["onload", "score"] if residency == "per_call" else ["score"])
    for refused in (lambda: host.score(items), host.onload, host.offload):
        with pytest.raises(ScorerWedged, match="never started: the scorer is wedged") as later:
            refused()
        assert not later.value.timed_out
    host.close(1.0)
    assert scorer.calls == (["onload", "score"] if residency == "per_call" else ["score"])


def test_a_standalone_server_whose_scorer_wedged_says_so_on_health(tmp_path):
    """A `serve` process has no parent to restart it: once its scorer wedged, its /health says
    `wedged`, not `ready`, so that a client of several servers passes it over and a liveness probe
    (or the operator's supervisor) can restart it; every call meanwhile is answered 503
    `wedged_queued`."""
    import httpx

    from supervisor import RemoteRewardBackend, RewardItem, RewardRequest
    from supervisor.errors import ScorerRequestError
    from tests.conftest import REPO_ROOT
    from tests.ops.test_cli_serve import start_serve, stop_serve, wait_ready

    args = [
        "--scorer",
        "tests.child.test_wedged:WedgesOnce",
        "--python",
        sys.executable,
        "--input-kind",
        "text",
    ]
    server, ready, log = start_serve(
        tmp_path, "wedged", *args, "--extra-import-path", str(REPO_ROOT)
    )
    try:
        url = f"http://127.0.0.1:{wait_ready(ready, 60)['port']}"
        auth = {"authorization": f"Bearer {'t' * 32}"}
        assert httpx.get(f"{url}/health", headers=auth, timeout=10).json()["state"] == "ready"
        request = RewardRequest(items=[RewardItem(id="a", text="x")])
        with RemoteRewardBackend(url, token="t" * 32, max_retries=3) as client:
            for kind in ("wedged", "wedged_queued"):
                with pytest.raises(ScorerRequestError) as refused:
                    client.compute_rewards(request)
                assert refused.value.kind == kind, refused.value
        health = httpx.get(f"{url}/health", headers=auth, timeout=10).json()
        assert (
            health["state"] == "wedged"
            and health["wedged"] == "1 call still runs past its deadline"
        )
    finally:
        assert stop_serve(server) == 0, log.read_text()[-2000:]
