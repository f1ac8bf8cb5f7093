"""RemoteRewardBackend against a real scorer server (a managed child we started ourselves)."""

from __future__ import annotations

import socket
import time

import pytest

from bench.misbehaving_server import MisbehavingServer
from supervisor import (
    RemoteRewardBackend,
    RewardContractError,
    RewardItem,
    RewardRequest,
    ScorerIdentityChanged,
    ScorerRequestError,
    ScorerTimeout,
    ScorerUnavailable,
)
from supervisor.errors import ConfigError
from tests.helpers.fixture_scorers import journal_calls

REQUEST = RewardRequest(items=[RewardItem(id=f"r{i}", text="x" * i) for i in range(5)])


def url(backend) -> str:
    return f"http://127.0.0.1:{backend._child.port}"


def test_remote_scores_like_managed_and_leaves_the_server_running(
    managed, trainer_python, tmp_path
):
    journal = str(tmp_path / "calls")
    server = managed(
        trainer_python, "tests.helpers.fixture_scorers:Probe", params={"journal": journal}
    )
    with RemoteRewardBackend(
        url(server), token=server._child.token, request_batch_size=2
    ) as remote:
        assert remote.server["scorer"] == "probe" and remote.required_rewards == ["probe"]
        # request_timeout: what DistributedRewards' default bound adds to
        assert remote.call_bound_s == 600.0
        response = remote.compute_rewards(REQUEST)
    assert response.rewards == server.compute_rewards(REQUEST).rewards == [0.0, 1.0, 2.0, 3.0, 4.0]
    # remote's chunks, then managed's
    assert [len(ids) for _, ids in journal_calls(journal)] == [2, 2, 1, 5]
    assert response.diagnostics == {"probe": {"sample_count": 5, "values": {"calls": 3}}}
    assert server.health()["state"] == "ready"


def test_remote_with_wrong_token_fails_at_construction(managed, trainer_python):
    server = managed(trainer_python, "tests.helpers.fixture_scorers:Probe")
    with pytest.raises(ScorerRequestError) as info:
        RemoteRewardBackend(url(server), token="not-the-token-0123456789")
    assert info.value.status == 401


def test_remote_refuses_unknown_required_rewards(managed, trainer_python):
    server = managed(trainer_python, "tests.helpers.fixture_scorers:Probe")
    with pytest.raises(ConfigError, match="not terms of scorer"):
        RemoteRewardBackend(url(server), token=server._child.token, required_rewards=["aesthetic"])


def test_remote_that_is_not_listening_is_unavailable():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed again before the client connects: refused
    with pytest.raises(ScorerUnavailable, match=f"127.0.0.1:{port}"):
        RemoteRewardBackend(f"http://127.0.0.1:{port}", token="x" * 20)


def test_a_trickled_answer_ends_the_call_at_request_timeout(managed, trainer_python):
    """A server that sends a valid answer one byte every 50 ms: httpx's per-read timeout never
    fires, the exchange's own deadline does (ScorerTimeout at request_timeout, retries included)."""
    server = managed(trainer_python, "tests.helpers.fixture_scorers:Probe")
    with MisbehavingServer(url(server), "trickle", trickle_s=0.05) as slow:
        with RemoteRewardBackend(
            slow.url, token=server._child.token, request_timeout=1.0
        ) as remote:
            began = time.monotonic()
            with pytest.raises(ScorerTimeout, match="no whole answer within"):
                remote.compute_rewards(REQUEST)
            assert time.monotonic() - began < 1.5


def test_a_compressed_answer_is_refused_before_it_is_decoded(managed, trainer_python):
    """64 MiB of zeros in 64 KB of gzip: the client asked for identity, so the answer is refused as
    it stands, never inflated in the trainer."""
    server = managed(trainer_python, "tests.helpers.fixture_scorers:Probe")
    with MisbehavingServer(url(server), "gzip_bomb", gzip_mib=64) as bomb:
        with RemoteRewardBackend(bomb.url, token=server._child.token) as remote:
            with pytest.raises(RewardContractError, match="compressed \\('gzip'\\)"):
                remote.compute_rewards(REQUEST)
    assert bomb.accept_encodings and set(bomb.accept_encodings) == {"identity"}


def test_an_answer_over_the_cap_is_refused(managed, trainer_python):
    server = managed(trainer_python, "tests.helpers.fixture_scorers:Probe")
    many = RewardRequest(items=[RewardItem(id=f"item-{i}", text="x") for i in range(200)])
    with RemoteRewardBackend(
        url(server), token=server._child.token, max_answer_bytes=1024
    ) as remote:
        assert remote.server["scorer"] == "probe"  # /health fits
        with pytest.raises(RewardContractError, match="exceeds the cap of 1024"):
            remote.compute_rewards(many)


def test_a_server_whose_health_does_not_say_what_it_serves_is_refused_typed(
    managed, trainer_python
):
    server = managed(trainer_python, "tests.helpers.fixture_scorers:Probe")
    with MisbehavingServer(url(server), "bare_health") as bare:
        with pytest.raises(RewardContractError, match="does not say what it serves .*'state'"):
            RemoteRewardBackend(bare.url, token=server._child.token)


def test_an_answer_that_names_no_identity_is_refused_as_a_version_mismatch(managed, trainer_python):
    """A server older than the identity header (its answers name none): its rewards are refused,
    said as a version mismatch, not retried; /health alone is not enough to trust an answer."""
    server = managed(trainer_python, "tests.helpers.fixture_scorers:Probe")
    with MisbehavingServer(url(server), "anonymous") as older:
        with RemoteRewardBackend(older.url, token=server._child.token) as remote:
            with pytest.raises(ScorerIdentityChanged, match="version mismatch") as info:
                remote.compute_rewards(REQUEST)
    assert info.value.url == older.url and info.value.got is None
    assert info.value.expected == server.identity_hash and "after 1 attempt" in str(info.value)


def test_every_score_answer_is_checked_against_the_identity_an_error_answer_too():
    """The one check (ScorerClient): another identity is refused, an error answer included; a
    success that names none is refused; an error that names none (a proxy's 503) stays an error."""
    from child_runtime.protocol import wire
    from child_runtime.protocol.headers import IDENTITY_HEADER
    from supervisor.child.client import ScorerClient
    from supervisor.errors import ErrorStatus, IdentityMismatch

    ours, theirs = "a" * 64, "b" * 64
    ok = bytes(b"".join(wire.prepare({"ids": [], "terms": {}}).body_parts()))
    busy = b'{"error": "later", "kind": "unavailable"}'

    class Canned:
        def __init__(self, status: int, named: str | None, body: bytes) -> None:
            self.answer = (status, {IDENTITY_HEADER: named} if named else {}, body)

        def request(self, *args: object) -> tuple[int, dict[str, str], bytes]:
            return self.answer

    def score(status: int, named: str | None, body: bytes) -> object:
        client = ScorerClient(Canned(status, named, body), 5.0, url="http://server")
        client.identity = ours
        return client.score(wire.prepare({"items": []}))

    assert score(200, ours, ok) == {"ids": [], "terms": {}}
    for status, named, body in ((200, theirs, ok), (200, None, ok), (503, theirs, busy)):
        with pytest.raises(IdentityMismatch) as info:
            score(status, named, body)
        assert (info.value.url, info.value.expected, info.value.got) == (
            "http://server",
            ours,
            named,
        )
    with pytest.raises(ErrorStatus) as error:
        score(503, None, busy)
    assert error.value.status == 503


def test_a_cancelled_call_ends_but_leaves_the_remote_backend_usable(managed, trainer_python):
    """asyncio.wait_for gives up on a call in flight: the call's connection is dropped (nothing
    retries behind the caller), and the backend serves the next call; only close() ends it for
    good."""
    import asyncio

    server = managed(trainer_python, "tests.helpers.fixture_scorers:Probe", params={"sleep_s": 1.0})
    with RemoteRewardBackend(url(server), token=server._child.token) as remote:
        with pytest.raises(TimeoutError):
            asyncio.run(asyncio.wait_for(remote.compute_rewards_async(REQUEST), 0.3))
        assert remote.compute_rewards(REQUEST).rewards == [0.0, 1.0, 2.0, 3.0, 4.0]
    with pytest.raises(ScorerUnavailable):
        remote.compute_rewards(REQUEST)
