"""Connections that never authenticate are bounded in number and time: another local user cannot
make the trainer lose its child."""

from __future__ import annotations

import json
import os
import resource
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from supervisor import RewardItem, RewardRequest, ScorerUnavailable
from tests.conftest import REPO_ROOT, eventually

REQUEST = RewardRequest(items=[RewardItem(id="a", text="abc")])


@contextmanager
def flood(port: int, count: int) -> Iterator[int]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.helpers.flood_connections", "hold", str(port), str(count)],
        cwd=REPO_ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        yield json.loads(proc.stdout.readline())["held"]
    finally:
        proc.kill()
        proc.wait()
        proc.stdin.close()
        proc.stdout.close()


def open_descriptors(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


@contextmanager
def descriptor_limit(soft: int) -> Iterator[None]:
    """The common RLIMIT_NOFILE of 1024, for the child this launches (it inherits it)."""
    was = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, was[1]))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, was)


@pytest.mark.slow
def test_five_thousand_idle_connections_cannot_make_the_trainer_kill_its_child(
    managed, trainer_python
):
    with descriptor_limit(1024):
        backend = managed(trainer_python, "constant", limits={"pending_connection_timeout_s": 2.0})
    pid, baseline = backend.pid, open_descriptors(backend.pid)
    with flood(backend._child.port, 5000) as held:
        assert held >= 2000
        # the child accepts them as they come, evicting the oldest beyond 64
        assert eventually(lambda: backend.health()["connections"]["evicted"] >= held - 64, 30)
        # bounded: 64 pending, 64 evicted lingering
        assert open_descriptors(pid) <= baseline + 2 * 64 + 4
        backend._gen.client.transport.http.drop_idle()  # the next call needs a fresh connection
        assert backend.compute_rewards(REQUEST).rewards == [1.0]
        assert backend.restarts == 0 and backend.pid == pid
        # bounded in time
        assert eventually(lambda: backend.health()["connections"]["pending"] == 0, 10)
    assert backend.compute_rewards(REQUEST).rewards == [1.0] and backend.restarts == 0


def test_a_connection_that_authenticates_is_never_evicted(managed, trainer_python):
    backend = managed(
        trainer_python,
        "constant",
        limits={"max_pending_connections": 2, "pending_connection_timeout_s": 0.3},
    )
    # admits the trainer's pooled connection
    assert backend.compute_rewards(REQUEST).rewards == [1.0]
    with flood(backend._child.port, 50):
        assert eventually(lambda: backend.health()["connections"] == {"pending": 0, "evicted": 50})
        assert backend._gen.client.transport.http.retries == 0
        assert backend.compute_rewards(REQUEST).rewards == [1.0]


@pytest.mark.slow
def test_a_sustained_connect_flood_never_makes_the_trainer_kill_its_child(managed, trainer_python):
    """Two processes connecting and closing as fast as they can: a call on a fresh connection is
    served, or fails as ScorerUnavailable (nothing reached the scorer); the child is never
    killed."""
    backend = managed(
        trainer_python,
        "constant",
        process={"request_timeout": 3},
        limits={"max_pending_connections": 8},
    )
    pid = backend.pid
    churn = [
        sys.executable,
        "-m",
        "tests.helpers.flood_connections",
        "churn",
        str(backend._child.port),
        "12",
    ]
    floods = [subprocess.Popen(churn, cwd=REPO_ROOT) for _ in range(2)]
    outcomes = []
    try:
        for _ in range(8):
            backend._gen.client.transport.http.drop_idle()
            try:
                outcomes.append(backend.compute_rewards(REQUEST).rewards)
            except ScorerUnavailable as exc:
                outcomes.append(type(exc).__name__)
    finally:
        for flood_proc in floods:
            flood_proc.kill()
            flood_proc.wait()
    assert all(outcome in ([1.0], "ScorerUnavailable") for outcome in outcomes), outcomes
    assert backend.restarts == 0 and backend.pid == pid and backend._child.returncode() is None
    assert backend.compute_rewards(REQUEST).rewards == [1.0]


def test_connections_that_sent_nothing_are_evicted_first_and_drained_not_reset(
    managed, trainer_python
):
    backend = managed(trainer_python, "constant", limits={"max_pending_connections": 2})
    port = backend._child.port
    # the trainer's own connection is admitted
    assert backend.health()["connections"]["pending"] == 0

    def connect(first_bytes: bytes = b"") -> socket.socket:
        sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        if first_bytes:
            sock.sendall(first_bytes)
        return sock

    silent_a, silent_b = connect(), connect()
    assert eventually(lambda: backend.health()["connections"]["pending"] == 2)
    talking = connect(b"POST /score HTTP/1.1\r\nhost: x\r\n")  # a request that never completes
    assert eventually(lambda: backend.health()["connections"]["evicted"] == 1)
    silent_c = connect()
    assert eventually(lambda: backend.health()["connections"]["evicted"] == 2)
    try:
        for sock in (silent_a, silent_b):  # the two oldest silent ones got the eviction notice
            assert sock.recv(4096).startswith(b"HTTP/1.1 503")
        talking.sendall(b"x" * (1 << 20))  # still pending: read by the server, not reset
        assert backend.health()["connections"] == {"pending": 2, "evicted": 2}
    finally:
        for sock in (silent_a, silent_b, talking, silent_c):
            sock.close()
