"""Child logs: a full disk never hides why a child failed; bad log directories are typed errors;
logs are bounded per scorer and rank; a clean child leaves none."""

from __future__ import annotations

import logging
import os
import subprocess
from pathlib import Path

import pytest

from supervisor import RewardItem, RewardRequest, ScorerStartupError
from supervisor.child import process as process_module
from supervisor.child import userdirs

REQUEST = RewardRequest(items=[RewardItem(id="a", text="abc")])


@pytest.fixture
def full_disk(monkeypatch, tmp_path):
    """Every child writes its log to /dev/full (ENOSPC on each write); tails come from an empty
    file."""
    tail = tmp_path / "unwritten.log"
    tail.touch()

    def open_full(*args: object) -> tuple[int, Path]:
        return os.open("/dev/full", os.O_WRONLY), tail

    monkeypatch.setattr(process_module, "open_child_log", open_full)


def test_a_full_log_disk_does_not_hide_a_boot_failure(managed, trainer_python, full_disk):
    with pytest.raises(ScorerStartupError) as info:
        managed(trainer_python, "no_such_scorer")
    assert info.value.boot_code == 3 and info.value.returncode == 3  # cannot boot: never restarted
    assert "unknown scorer 'no_such_scorer'" in str(info.value)


def test_a_child_with_a_full_log_disk_serves_and_exits_cleanly(managed, trainer_python, full_disk):
    backend = managed(trainer_python, "constant")
    assert backend.compute_rewards(REQUEST).rewards == [1.0]
    backend.close()
    assert backend._child.returncode() == 0


def _read_only_dir(path: Path) -> Path:
    path.mkdir()
    if os.geteuid() != 0:
        path.chmod(0o500)
        return path
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(path)], capture_output=True
    )
    if mounted.returncode != 0:
        pytest.skip(
            f"root cannot be denied a write without a read-only mount: "
            f"{mounted.stderr.decode().strip()}"
        )
    return path


@pytest.fixture
def read_only_dir(tmp_path):
    path = _read_only_dir(tmp_path / "read-only")
    yield path
    if os.geteuid() == 0:
        subprocess.run(["umount", str(path)], check=True)


def _foreign_dir(tmp_path: Path) -> Path:
    """A directory that belongs to another user."""
    if os.geteuid() != 0:
        return Path("/")
    path = tmp_path / "foreign"
    path.mkdir(mode=0o777)
    os.chown(path, 65534, 65534)
    return path


def test_a_read_only_log_dir_is_a_startup_error(managed, trainer_python, read_only_dir):
    with pytest.raises(ScorerStartupError, match="cannot create the child's log file") as info:
        managed(trainer_python, "constant", process={"log_dir": str(read_only_dir)})
    assert str(read_only_dir) in str(info.value) and info.value.pid is None


def test_a_file_in_the_way_of_the_log_dir_is_a_startup_error(managed, trainer_python, tmp_path):
    (tmp_path / "logs").write_text("not a directory")
    with pytest.raises(ScorerStartupError, match="cannot create the child's log file") as info:
        managed(trainer_python, "constant", process={"log_dir": str(tmp_path / "logs" / "child")})
    assert str(tmp_path / "logs") in str(info.value)


def test_a_log_dir_owned_by_another_user_is_a_startup_error(managed, trainer_python, tmp_path):
    foreign = _foreign_dir(tmp_path)
    with pytest.raises(ScorerStartupError, match="not to this user"):
        managed(trainer_python, "constant", process={"log_dir": str(foreign)})


def test_another_user_cannot_block_default_launches_by_creating_the_default_dir(
    managed, trainer_python, tmp_path, monkeypatch, caplog
):
    cache = tmp_path / "cache"
    cache.mkdir()
    squatted = cache / "managed-scorers"
    squatted.mkdir(mode=0o777)
    squatted.chmod(0o777)  # writable by anyone: not ours to trust, whoever owns it
    if os.geteuid() == 0:
        os.chown(squatted, 65534, 65534)
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    monkeypatch.setattr(userdirs, "_fallback", None)
    with caplog.at_level(logging.WARNING, logger="supervisor.child.userdirs"):
        backend = managed(trainer_python, "constant", process={"keep_clean_logs": True})
    assert backend.compute_rewards(REQUEST).rewards == [1.0]
    log_dir = Path(backend.log_path).parent
    assert squatted not in log_dir.parents and log_dir.stat().st_uid == os.getuid()
    assert (log_dir.parent.stat().st_mode & 0o777) == 0o700
    assert f"cannot use {squatted}" in caplog.text
    assert list(squatted.iterdir()) == []


def test_old_logs_of_gone_trainers_are_pruned_and_a_live_trainers_are_kept(
    managed, trainer_python, tmp_path
):
    log_dir = tmp_path / "logs"
    log_dir.mkdir(mode=0o700)
    gone = subprocess.Popen(["true"])
    gone.wait()  # a trainer pid that no longer runs
    old = [
        log_dir / f"constant-rank0-pid{gone.pid}-2026110{day}-000000-abcdef.log"
        for day in range(1, 5)
    ]
    # the oldest, but its
    live = log_dir / f"constant-rank0-pid{os.getpid()}-20261001-000000-abcdef.log"
    # trainer (this process) may still have a child writing it
    for age, path in enumerate([live, *old]):
        path.write_text("x")
        os.utime(path, (1_000_000 + age, 1_000_000 + age))
    other_scorer = log_dir / f"nonempty-rank0-pid{gone.pid}-20261101-000000-abcdef.log"
    other_scorer.write_text("x")
    backend = managed(trainer_python, "constant", process={"log_dir": str(log_dir), "keep_logs": 3})
    assert sorted(log_dir.glob("constant-rank0-*.log")) == sorted(
        [live, old[-1], Path(backend.log_path)]
    )
    assert other_scorer.exists()  # kept per scorer and rank


def test_a_clean_child_leaves_no_log_and_a_failed_one_keeps_it(managed, trainer_python, tmp_path):
    log_dir = tmp_path / "logs"
    clean = managed(trainer_python, "constant", process={"log_dir": str(log_dir)})
    clean.close()
    assert not Path(clean.log_path).exists()
    with pytest.raises(ScorerStartupError) as info:
        managed(
            trainer_python,
            "tests.helpers.fixture_scorers:LoadFails",
            process={"log_dir": str(log_dir)},
        )
    assert Path(info.value.record.log_path).exists()


def test_a_log_pruned_by_a_concurrent_launch_between_listing_and_stat_is_skipped(
    tmp_path, monkeypatch
):
    """Two children of one scorer and rank starting at once (a panel's terms, replicas) prune the
    same prefix: one may remove a log the other has listed but not yet stat'ed."""
    import supervisor.child.logs as logs

    for n in range(3):
        (tmp_path / f"s-rank0-pid999999{n}-20260101-000000-00000{n}.log").write_text("old")
    real_scandir = os.scandir

    class Vanishing:
        def __init__(self, entry: os.DirEntry) -> None:
            self.entry, self.name = entry, entry.name

        def is_file(self, follow_symlinks: bool = True) -> bool:
            return self.entry.is_file(follow_symlinks=follow_symlinks)

        def stat(self, follow_symlinks: bool = True) -> os.stat_result:
            os.unlink(self.entry.path)  # the other launch's prune wins the race
            return self.entry.stat(follow_symlinks=follow_symlinks)

    class Listing(list):
        def __enter__(self) -> Listing:
            return self

        def __exit__(self, *exc: object) -> None:
            return None

    def scandir(path):
        entries = sorted(real_scandir(path), key=lambda entry: entry.name)
        return Listing(
            [Vanishing(entries[0]), *entries[1:]] if str(path) == str(tmp_path) else entries
        )

    monkeypatch.setattr(logs.os, "scandir", scandir)
    fd, path = logs.open_child_log(tmp_path, "s", 0, keep=2)
    os.close(fd)
    assert path.exists() and len(list(tmp_path.glob("s-rank0-*.log"))) == 2
