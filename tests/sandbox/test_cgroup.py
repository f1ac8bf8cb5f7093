"""A cgroup per sandbox where the machine lets the scorer make one (`scorers.sandbox.cgroup`): the
kernel bounds all of the sandbox's memory together, its tmpfs files included, and the cgroup is
gone with the sandbox. This VM (cgroup v1 hybrid, tests as root) gives the scorer its own v1
memory cgroup; its cgroup v2 hierarchy has no memory controller, which a delegated folder must
offer: both are real here, nothing is faked."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from scorers.sandbox import Limits, SandboxUnavailable, cgroup, probe, run_sandboxed
from tests.conftest import env_python

# 160 MiB written into the sandbox's tmpfs: its files, not any process's resident memory
FILL_TMPFS = (
    "out = open('/tmp/fill', 'wb')\n"
    "for _ in range(160):\n"
    "    out.write(b'x' * (1 << 20))\n"
    "out.close()\n"
    "print('wrote')\n"
)
LIMITS = Limits(memory_bytes=96 << 20, tmpfs_bytes=256 << 20, file_bytes=256 << 20, wall_s=30)


@pytest.fixture(scope="module")
def python() -> str:
    return str(env_python("code"))


def _place() -> cgroup.Place:
    place, why = cgroup.find()
    if place is None:
        pytest.skip(f"no cgroup for sandboxes on this machine: {why}")
    return place


def _left(place: cgroup.Place) -> list[Path]:
    return sorted(place.parent.glob(f"{cgroup.PREFIX}{os.getpid()}-*"))


def test_the_cgroup_counts_the_sandboxs_files_and_goes_with_it(python, monkeypatch):
    place = _place()
    bounded = run_sandboxed([python, "-I", "-c", FILL_TMPFS], python=python, limits=LIMITS)
    assert bounded.status == "memory" and "cgroup" in bounded.detail, bounded
    assert 0 < bounded.peak_rss_bytes <= LIMITS.memory_bytes
    assert _left(place) == []
    # the same run without the cgroup: the tmpfs holds the files, no process holds the memory
    monkeypatch.setenv(cgroup.ENV, "off")
    free = run_sandboxed([python, "-I", "-c", FILL_TMPFS], python=python, limits=LIMITS)
    assert (free.status, free.stdout) == ("exited", b"wrote\n"), free


def test_cgroups_left_by_a_dead_scorer_are_swept(monkeypatch):
    place = _place()
    stale = place.parent / f"{cgroup.PREFIX}{2**22 + 7}-0"  # past pid_max's default: no such pid
    stale.mkdir()
    try:
        monkeypatch.setattr(cgroup, "_SWEPT", set())
        cgroup.find()
        assert not stale.exists()
    finally:
        if stale.exists():
            stale.rmdir()


def _cgroup2_without_memory() -> Path:
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields, _, rest = line.partition(" - ")
        if rest.split()[0] == "cgroup2":
            point = Path(fields.split()[4])
            if "memory" not in (point / "cgroup.controllers").read_text().split():
                return point
    pytest.skip("no cgroup v2 hierarchy without the memory controller here")


def test_a_delegated_folder_that_cannot_bound_memory_refuses_the_boot(
    python, monkeypatch, tmp_path
):
    monkeypatch.setenv(cgroup.ENV, str(tmp_path))
    with pytest.raises(SandboxUnavailable, match="is not a cgroup v2 folder"):
        probe(python)
    folder = _cgroup2_without_memory() / f"{cgroup.PREFIX}test-{os.getpid()}"
    try:
        folder.mkdir()
    except PermissionError:
        pytest.skip(f"cannot make a cgroup v2 folder under {folder.parent}")
    try:
        monkeypatch.setenv(cgroup.ENV, str(folder))
        with pytest.raises(SandboxUnavailable, match="does not offer the memory controller"):
            probe(python)
    finally:
        folder.rmdir()
