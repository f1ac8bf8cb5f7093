"""RemoteRewardBackend against a real scorer server (a managed child we started ourselves)."""

from __future__ import annotations

import socket

import pytest

from supervisor import (
    RemoteRewardBackend,
    RewardItem,
    RewardRequest,
    ScorerRequestError,
    ScorerUnavailable,
)
from supervisor.errors import ConfigError
from tests.fixture_scorers import journal_calls

REQUEST = RewardRequest(items=[RewardItem(id=f"r{i}", text="x" * i) for i in range(5)])


def url(backend) -> str:
    return f"http://127.0.0.1:{backend._child.port}"


def test_remote_scores_like_managed_and_leaves_the_server_running(managed, trainer_python, tmp_path):
    journal = str(tmp_path / "calls")
    server = managed(trainer_python, "tests.fixture_scorers:Probe", params={"journal": journal})
    with RemoteRewardBackend(url(server), token=server._child.token, request_batch_size=2) as remote:
        assert remote.server["scorer"] == "probe" and remote.required_rewards == ["probe"]
        response = remote.compute_rewards(REQUEST)
    assert response.rewards == server.compute_rewards(REQUEST).rewards == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert [len(ids) for _, ids in journal_calls(journal)] == [2, 2, 1, 5]  # remote's chunks, then managed's
    assert response.diagnostics == {"probe": {"sample_count": 5, "values": {"calls": 3}}}
    assert server.health()["state"] == "ready"


def test_remote_with_wrong_token_fails_at_construction(managed, trainer_python):
    server = managed(trainer_python, "tests.fixture_scorers:Probe")
    with pytest.raises(ScorerRequestError) as info:
        RemoteRewardBackend(url(server), token="not-the-token-0123456789")
    assert info.value.status == 401


def test_remote_refuses_unknown_required_rewards(managed, trainer_python):
    server = managed(trainer_python, "tests.fixture_scorers:Probe")
    with pytest.raises(ConfigError, match="not terms of scorer"):
        RemoteRewardBackend(url(server), token=server._child.token, required_rewards=["aesthetic"])


def test_remote_that_is_not_listening_is_unavailable():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed again before the client connects: refused
    with pytest.raises(ScorerUnavailable, match=f"127.0.0.1:{port}"):
        RemoteRewardBackend(f"http://127.0.0.1:{port}", token="x" * 20)
