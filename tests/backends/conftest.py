"""What the job backend's tests share: the fake job service, a backend on it with fast polls, and
the check that every thread either started ends with the test."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from supervisor.backends.jobs import JobRewardBackend
from tests.conftest import eventually
from tests.helpers.fake_jobs import FakeJobService

TOKEN = "job-token"
FAST = {"poll_interval_s": 0.02, "poll_backoff_cap_s": 0.1, "fps": 16.0}


@pytest.fixture
def no_thread_left() -> Iterator[None]:
    """The backend's and the fake's threads all end with the test."""
    before = set(threading.enumerate())
    yield
    assert eventually(lambda: set(threading.enumerate()) <= before, timeout=5), (
        set(threading.enumerate()) - before
    )


@pytest.fixture
def service() -> Iterator[FakeJobService]:
    with FakeJobService(TOKEN) as fake:
        yield fake


@pytest.fixture
def backend(service: FakeJobService, tmp_path: Path) -> Iterator[JobRewardBackend]:
    with JobRewardBackend(
        service.url, TOKEN, spool_dir=str(tmp_path), request_timeout=5.0, **FAST
    ) as made:
        yield made
