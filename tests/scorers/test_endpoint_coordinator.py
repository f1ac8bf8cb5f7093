"""The cross-node coordinator of shared endpoint limits (supervisor.limits) and its callers
(scorers.limits.remote): leases of a dead caller expire and a live one's are renewed, another
declaration or a wrong token is refused, and a coordinator that stops answering, hung or gone,
leaves each node a share of the limit (never unlimited) found within a poll. The limit across two
raylets: tests/trainers/test_ray_pool.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import psutil
import pytest

from scorers.builtin.llm_judge import LlmJudge
from scorers.limits import (
    CoordinatedLimiter,
    Coordination,
    EndpointLimit,
    Lease,
    LimitConflict,
    LimitStateError,
    LimitTimeout,
    board,
    remote,
)
from scorers.limits.rundir import DIR_ENV
from supervisor.limits.hosting import in_thread
from tests.conftest import REPO_ROOT

TOKEN = "coordinator-token-of-the-tests"
LIMIT = EndpointLimit("judge-api", requests_per_minute=6000, concurrency=2)


@pytest.fixture(autouse=True)
def quick(tmp_path, monkeypatch):
    """Leases that expire in 0.6 s, renewed every 0.1 s; polls of 0.5 s; this test's files."""
    monkeypatch.setattr(board, "LEASE_TTL_S", 0.6)
    monkeypatch.setattr(remote, "RENEW_S", 0.1)
    monkeypatch.setattr(remote, "POLL_S", 0.5)
    monkeypatch.setattr(remote, "CONNECT_S", 1.0)
    monkeypatch.setenv(DIR_ENV, str(tmp_path / "limits"))


@pytest.fixture
def coordinator():
    hosted = in_thread("127.0.0.1", 0, TOKEN)
    yield hosted
    hosted.stop()


def _limiter(
    url: str, limit: EndpointLimit = LIMIT, nodes: int | None = None
) -> CoordinatedLimiter:
    return CoordinatedLimiter(limit, Coordination(url, TOKEN, nodes))


def test_a_dead_callers_leases_expire_and_a_live_ones_are_renewed(coordinator):
    """Two slots: one held by a caller that lives on past several lease lifetimes, one by a caller
    that stops renewing (a rank killed -9): a third caller waits, then takes the dead one's slot,
    never the live one's."""
    live, dead, third = (_limiter(coordinator.url) for _ in range(3))
    try:
        held = live.acquire(10, time.monotonic() + 5)
        dead.acquire(10, time.monotonic() + 5)
        dead.close()  # its renewals stop, as a killed process's do
        began = time.monotonic()
        with pytest.raises(LimitTimeout, match=r"concurrency \(2 in flight of 2\)"):
            third.acquire(10, time.monotonic() + 0.2)
        taken = third.acquire(10, time.monotonic() + 5)
        assert 0.3 < time.monotonic() - began < 3.0
        time.sleep(1.5)  # past two lifetimes: the live lease is renewed, so the slots stay full
        with pytest.raises(LimitTimeout):
            third.acquire(10, time.monotonic() + 0.3)
        held.end(latency_s=0.1)
        taken.end(latency_s=0.1)
        third.acquire(10, time.monotonic() + 1).end()
    finally:
        for limiter in (live, third):
            limiter.close()


def test_another_declaration_and_a_wrong_token_are_refused(coordinator):
    first = _limiter(coordinator.url)
    other = _limiter(coordinator.url, EndpointLimit("judge-api", concurrency=5))
    intruder = CoordinatedLimiter(LIMIT, Coordination(coordinator.url, "x" * 32))
    try:
        lease = first.acquire(10, time.monotonic() + 5)
        with pytest.raises(LimitConflict, match="the same name must carry the same limits"):
            other.acquire(10, time.monotonic() + 5)
        with pytest.raises(LimitStateError, match="HTTP 401"):
            intruder.acquire(10, time.monotonic() + 5)
        lease.end()
    finally:
        for limiter in (first, other, intruder):
            limiter.close()


def test_a_hung_coordinator_leaves_each_node_its_share_within_a_poll(tmp_path):
    """`managed-scorers limits-coordinator` SIGSTOPped: a call waits one poll and the connect
    margin, then takes this node's share, 1/4 of the limit for `nodes: 4` (2 of 8 in flight), from
    the node's files; with no node count known it fails naming the coordinator."""
    env = {**os.environ, remote.TOKEN_ENV: TOKEN, "PYTHONPATH": str(REPO_ROOT)}
    command = [sys.executable, "-m", "supervisor", "limits-coordinator", "--port", "0"]
    server = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, text=True)
    limiters = []
    try:
        assert server.stdout is not None
        url = json.loads(server.stdout.readline())["url"]
        limit = EndpointLimit("judge-api", concurrency=8)
        counted, unknown = _limiter(url, limit, nodes=4), _limiter(url, limit)
        limiters += [counted, unknown]
        counted.acquire(10, time.monotonic() + 5).end(latency_s=0.1)  # the coordinator answers
        assert counted.share_now() is None
        server.send_signal(signal.SIGSTOP)
        began = time.monotonic()
        lease = counted.acquire(10, time.monotonic() + 30)
        assert time.monotonic() - began < remote.POLL_S + remote.CONNECT_S + 1.0
        share = counted.share_now()
        assert share is not None and share.concurrency == 2 and "[1/4]" in share.name
        assert isinstance(lease, Lease)  # the node's own, from its files
        lease.end()
        with pytest.raises(LimitStateError, match=rf"{url} cannot be reached .* nodes: N"):
            unknown.acquire(10, time.monotonic() + 30)
    finally:
        for limiter in limiters:
            limiter.close()
        server.send_signal(signal.SIGCONT)
        server.terminate()
        server.wait(timeout=30)
    assert not psutil.pid_exists(server.pid)


def test_a_judge_takes_its_coordinator_from_the_recipe_or_the_environment(monkeypatch):
    monkeypatch.setenv(remote.COORDINATOR_ENV, "http://10.0.0.5:8790")
    monkeypatch.setenv(remote.TOKEN_ENV, TOKEN)
    params = {"base_url": "http://127.0.0.1:9/v1", "model": "m"}
    judge = LlmJudge(**params, endpoint_limit={"concurrency": 4})
    assert judge.coordination == Coordination("http://10.0.0.5:8790", TOKEN, None)
    judge = LlmJudge(**params, endpoint_limit={"concurrency": 4, "coordinator": "local"})
    assert judge.coordination is None and judge.endpoint_limit is not None
    named = {"concurrency": 4, "coordinator": "http://head:8790", "nodes": 64}
    assert LlmJudge(**params, endpoint_limit=named).coordination == Coordination(
        "http://head:8790", TOKEN, 64
    )
    for bad, message in (
        ({"concurrency": 4, "coordinator": "head:8790"}, "must be 'local' or http://HOST:PORT"),
        ({"concurrency": 4, "nodes": 0}, "nodes must be a positive int"),
    ):
        with pytest.raises(ValueError, match=message):
            LlmJudge(**params, endpoint_limit=bad)
    monkeypatch.delenv(remote.TOKEN_ENV)
    with pytest.raises(ValueError, match="needs its token"):
        LlmJudge(**params, endpoint_limit={"concurrency": 4})


def test_calls_from_threads_that_come_and_go_keep_a_few_connections_open(coordinator):
    """A judge starts new threads each batch: 20 batches of 4 threads, a lease each, leave no more
    connections open than 4 threads used at once (and the keeper's)."""
    limiter = _limiter(coordinator.url, EndpointLimit("threads", concurrency=8))
    me = psutil.Process()
    try:
        limiter.acquire(10, time.monotonic() + 5).end(latency_s=0.1)
        before = me.num_fds()
        for _ in range(20):
            leases: list = []

            def take(into: list = leases) -> None:
                into.append(limiter.acquire(10, time.monotonic() + 5))

            threads = [threading.Thread(target=take) for _ in range(4)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            for lease in leases:
                lease.end(latency_s=0.1)
        # both ends of each connection are this process's (the coordinator serves in a thread):
        # 5 connections at most, 10 descriptors; one per thread would be 160
        assert me.num_fds() <= before + 10, (before, me.num_fds())
    finally:
        limiter.close()
