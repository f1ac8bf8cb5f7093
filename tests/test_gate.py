"""Connections that never authenticate are bounded in number and time: another local user cannot
make the trainer lose its child."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from supervisor import RewardItem, RewardRequest
from tests.conftest import REPO_ROOT, eventually

REQUEST = RewardRequest(items=[RewardItem(id="a", text="abc")])


@contextmanager
def flood(port: int, count: int) -> Iterator[int]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.flood_connections", str(port), str(count)],
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
def test_five_thousand_idle_connections_cannot_make_the_trainer_kill_its_child(managed, trainer_python):
    with descriptor_limit(1024):
        backend = managed(trainer_python, "constant", limits={"pending_connection_timeout_s": 2.0})
    pid, baseline = backend.pid, open_descriptors(backend.pid)
    with flood(backend._child.port, 5000) as held:
        assert held >= 2000
        # the child accepts them as they come, evicting the oldest beyond 64
        assert eventually(lambda: backend.health()["connections"]["evicted"] >= held - 64, 30)
        assert open_descriptors(pid) <= baseline + 64 + 4  # bounded in number
        assert backend.compute_rewards(REQUEST).rewards == [1.0]  # a fresh connection from the trainer
        assert backend.restarts == 0 and backend.pid == pid
        assert eventually(lambda: backend.health()["connections"]["pending"] == 0, 10)  # bounded in time
    assert backend.compute_rewards(REQUEST).rewards == [1.0] and backend.restarts == 0


def test_a_connection_that_authenticates_is_never_evicted(managed, trainer_python):
    backend = managed(
        trainer_python, "constant", limits={"max_pending_connections": 2, "pending_connection_timeout_s": 0.3}
    )
    assert backend.compute_rewards(REQUEST).rewards == [1.0]  # admits the trainer's pooled connection
    with flood(backend._child.port, 50):
        assert eventually(lambda: backend.health()["connections"] == {"pending": 0, "evicted": 50})
        assert backend._gen.client.transport.http.retries == 0
        assert backend.compute_rewards(REQUEST).rewards == [1.0]
