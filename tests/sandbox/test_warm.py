"""WarmSandboxes: runs on sandboxes prepared ahead, each still a fresh sandbox for one program."""

from __future__ import annotations

import os
import signal
import time

import psutil
import pytest

from scorers.sandbox import Limits, WarmSandboxes
from tests.conftest import env_python

# what one run leaves behind, and what it finds of the run before it
PROGRAM = (
    "import os; found = os.listdir('/tmp'); open('/tmp/left', 'w').write('x'); "
    "print(os.getpid(), sorted(found))"
)


@pytest.fixture(scope="module")
def python() -> str:
    return str(env_python("code"))


def _filled(pool: WarmSandboxes) -> bool:
    """Wait (10 s at most) until the pool holds as many prepared sandboxes as it keeps."""
    deadline = time.monotonic() + 10
    while pool.ready() < pool.size and time.monotonic() < deadline:
        time.sleep(0.01)
    return pool.ready() == pool.size


def _bwraps() -> list[psutil.Process]:
    return [p for p in psutil.Process().children(recursive=True) if p.name() == "bwrap"]


def test_each_run_is_a_fresh_sandbox_and_the_pool_stays_full(python):
    with WarmSandboxes(python, size=2) as pool:
        results = [
            pool.run_sandboxed([python, "-I", "-c", PROGRAM], python=python) for _ in range(4)
        ]
        assert _filled(pool)
    seen = set()
    for result in results:
        assert result.status == "exited", result
        # pid 2 of its own namespace (the launcher is 1), and nothing of the run before it (an
        # interpreter under /tmp, as in a CI clone, is bound into it: the same in every run)
        pid, found = result.stdout.decode().split(" ", 1)
        assert pid == "2" and "left" not in found, result.stdout
        seen.add(found)
    assert len(seen) == 1, seen
    assert not _bwraps()


def test_a_prepared_sandbox_that_died_while_waiting_is_never_handed_out(python):
    with WarmSandboxes(python, size=1) as pool:
        assert _filled(pool)
        (waiting,) = _bwraps_of_group()
        os.killpg(waiting, signal.SIGKILL)
        psutil.Process(waiting).wait(timeout=10)
        result = pool.run_sandboxed([python, "-I", "-c", "print(7)"], python=python)
    assert (result.status, result.stdout) == ("exited", b"7\n")


def _bwraps_of_group() -> list[int]:
    """The process groups of the prepared sandboxes (each bwrap leads its own), once each has
    become bwrap (a sandbox with a cgroup starts as the shell that joins it: 5 s at most)."""
    deadline = time.monotonic() + 5
    while not _bwraps() and time.monotonic() < deadline:
        time.sleep(0.01)
    return sorted({os.getpgid(p.pid) for p in _bwraps()})


def test_a_run_the_pool_was_not_prepared_for_starts_cold_and_close_is_final(python):
    pool = WarmSandboxes(python, size=1, tmpfs_bytes=8 << 20)
    other = Limits(tmpfs_bytes=16 << 20)
    result = pool.run_sandboxed([python, "-I", "-c", "print(1)"], python=python, limits=other)
    assert (result.status, result.stdout, _filled(pool)) == ("exited", b"1\n", True)
    pool.close()
    pool.close()
    assert not _bwraps()
    with pytest.raises(RuntimeError, match="closed"):
        pool.run_sandboxed([python, "-c", "pass"], python=python)


def test_a_pool_keeps_at_least_one():
    with pytest.raises(ValueError, match="at least one"):
        WarmSandboxes("/usr/bin/python3", size=0)
