"""Restart policy: the failing call raises, the next call gets a fresh child, crash loops stop."""

from __future__ import annotations

import os
import signal
import threading
import time

import psutil
import pytest

from bench.fault_matrix import rogue_python
from supervisor import (
    RewardContractError,
    RewardItem,
    RewardRequest,
    ScorerCrashLoop,
    ScorerError,
    ScorerProcessDied,
    ScorerRequestError,
    ScorerStartupError,
    ScorerTimeout,
)
from tests.conftest import REPO_ROOT, alive, eventually, group_members, wait_until_gone

REQUEST = RewardRequest(items=[RewardItem(id="a", text="abc")])


def kill_and_wait(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)
    assert wait_until_gone([pid], 5) == []


def crash(backend) -> None:
    """kill -9 the child; the call that finds it dead raises (and is never retried)."""
    kill_and_wait(backend.pid)
    with pytest.raises(ScorerProcessDied):
        backend.compute_rewards(REQUEST)


def test_next_call_restarts_after_the_backoff(managed, trainer_python):
    backend = managed(
        trainer_python, "tests.helpers.fixture_scorers:Probe", restart={"backoff_s": 0.5}
    )
    first = backend.pid
    kill_and_wait(first)
    # a killed multi-threaded child shows as a zombie a moment before waitid can report it
    with pytest.raises(ScorerProcessDied, match="exited between calls|died during score"):
        backend.compute_rewards(REQUEST)
    started = time.monotonic()
    assert backend.compute_rewards(REQUEST).rewards == [3.0]
    elapsed = time.monotonic() - started
    assert backend.pid != first and backend.restarts == 1 and alive(backend.pid)
    assert 0.3 < elapsed < 10, elapsed  # waited for the backoff, then a spawn
    assert group_members(first) == []


def test_crash_loop_stops_with_a_clear_error(managed, trainer_python):
    backend = managed(
        trainer_python,
        "tests.helpers.fixture_scorers:Probe",
        restart={"max_restarts": 2, "backoff_s": 0, "window_s": 120},
    )
    for expected in (1, 2):
        crash(backend)
        assert backend.compute_rewards(REQUEST).rewards == [3.0] and backend.restarts == expected
    crash(backend)
    with pytest.raises(ScorerCrashLoop, match=r"2 restarts in the last 120 s \(max_restarts=2\)"):
        backend.compute_rewards(REQUEST)


def test_max_restarts_zero_never_restarts(managed, trainer_python):
    backend = managed(
        trainer_python, "tests.helpers.fixture_scorers:Probe", restart={"max_restarts": 0}
    )
    crash(backend)
    with pytest.raises(ScorerCrashLoop, match="no longer serving"):
        backend.compute_rewards(REQUEST)


def test_a_restart_that_fails_to_load_counts_against_the_policy(managed, trainer_python, tmp_path):
    """A load failure on restart (exit 6) may be transient (OOM): retried, until the crash-loop
    bound."""
    backend = managed(
        trainer_python,
        "tests.helpers.fixture_scorers:BootsOnce",
        params={"marker": str(tmp_path / "m")},
        restart={"backoff_s": 0, "max_restarts": 2},
    )
    crash(backend)
    for _ in range(2):  # each restart fails to load
        with pytest.raises(ScorerStartupError) as info:
            backend.compute_rewards(REQUEST)
        assert info.value.returncode == 6 and "checkpoint vanished" in str(info.value)
    with pytest.raises(ScorerCrashLoop, match="2 restarts"):
        backend.compute_rewards(REQUEST)


def test_a_restart_that_cannot_import_the_scorer_is_not_tried_again(
    managed, trainer_python, tmp_path
):
    """Exit 4 (import failed) or 3 (bad config) will fail the same way every time: never retried."""
    module = tmp_path / "vanishing_scorer.py"
    module.write_text("from tests.helpers.fixture_scorers import Probe as Vanishing\n")
    backend = managed(
        trainer_python,
        "vanishing_scorer:Vanishing",
        restart={"backoff_s": 0},
        process={"extra_import_paths": [str(tmp_path), str(REPO_ROOT)]},
    )
    module.unlink()
    crash(backend)
    with pytest.raises(ScorerStartupError) as info:
        backend.compute_rewards(REQUEST)
    assert info.value.returncode == 4
    before = {child.pid for child in psutil.Process().children(recursive=True)}
    with pytest.raises(ScorerStartupError, match="not restarting: the child cannot boot"):
        backend.compute_rewards(REQUEST)
    # nothing spawned
    assert {child.pid for child in psutil.Process().children(recursive=True)} <= before


def test_a_restarted_child_keeps_the_residency_the_trainer_asked_for(managed, trainer_python):
    backend = managed(
        trainer_python, "tests.helpers.fixture_scorers:Probe", restart={"backoff_s": 0}
    )
    backend.offload()
    kill_and_wait(backend.pid)
    with pytest.raises(ScorerProcessDied):
        backend.health()
    assert backend.onload()["residency"] == "resident"  # onload restarts, then onloads
    assert backend.restarts == 1 and backend.compute_rewards(REQUEST).rewards == [3.0]
    backend.offload()
    kill_and_wait(backend.pid)
    with pytest.raises(ScorerProcessDied):
        backend.compute_rewards(REQUEST)
    # restarted offloaded, as the trainer left it: 409
    with pytest.raises(ScorerRequestError) as info:
        backend.compute_rewards(REQUEST)
    assert info.value.status == 409
    assert backend.health()["residency"] == "offloaded"


def test_health_does_not_restart(managed, trainer_python):
    backend = managed(
        trainer_python, "tests.helpers.fixture_scorers:Probe", restart={"backoff_s": 0}
    )
    crash(backend)
    with pytest.raises(ScorerProcessDied, match="the next score or onload restarts it"):
        backend.health()
    assert backend.restarts == 0


def test_close_during_the_restart_backoff_wins(managed, trainer_python):
    backend = managed(
        trainer_python, "tests.helpers.fixture_scorers:Probe", restart={"backoff_s": 5}
    )
    crash(backend)
    threading.Timer(0.5, backend.close).start()
    started = time.monotonic()
    with pytest.raises(ScorerProcessDied, match="closed while waiting to restart"):
        backend.compute_rewards(REQUEST)
    assert time.monotonic() - started < 3 and backend.restarts == 0


def test_the_failing_request_is_never_sent_twice(managed, trainer_python, tmp_path):
    journal = tmp_path / "journal"
    backend = managed(
        trainer_python,
        "tests.helpers.fixture_scorers:Journal",
        params={"path": str(journal), "sleep_s": 30},
        restart={"backoff_s": 0},
    )
    pid = backend.pid

    def kill_once_journaled() -> None:  # the scorer wrote the id: the request is being scored
        deadline = time.monotonic() + 10
        while not (journal.exists() and journal.read_text()) and time.monotonic() < deadline:
            time.sleep(0.01)
        os.kill(pid, signal.SIGKILL)

    killer = threading.Thread(target=kill_once_journaled)
    killer.start()
    with pytest.raises(ScorerProcessDied):
        backend.compute_rewards(RewardRequest(items=[RewardItem(id="doomed", text="slow")]))
    assert backend.compute_rewards(
        RewardRequest(items=[RewardItem(id="next", text="fast")])
    ).rewards == [1.0]
    killer.join()
    assert journal.read_text().split() == ["doomed", "next"]


def test_hung_child_times_out_is_killed_and_replaced(managed, trainer_python):
    backend = managed(
        trainer_python,
        "tests.helpers.fixture_scorers:Probe",
        process={"request_timeout": 1.0},
        restart={"backoff_s": 0},
    )
    hung = backend.pid
    os.kill(hung, signal.SIGSTOP)
    started = time.monotonic()
    with pytest.raises(ScorerTimeout) as info:
        backend.compute_rewards(REQUEST)
    assert time.monotonic() - started < 5 and info.value.signal_name == "SIGKILL"
    assert not alive(hung)
    assert backend.compute_rewards(REQUEST).rewards == [3.0] and backend.pid != hung


def test_a_child_answering_for_wrong_ids_is_killed_and_never_trusted(
    managed, trainer_python, tmp_path
):
    backend = managed(
        rogue_python(tmp_path, trainer_python),
        "tests.helpers.fixture_scorers:Probe",
        restart={"max_restarts": 1, "backoff_s": 0},
    )
    two = RewardRequest(items=[RewardItem(id="x", text="a"), RewardItem(id="y", text="bb")])
    first = backend.pid
    with pytest.raises(RewardContractError, match="child killed"):
        backend.compute_rewards(two)
    assert not alive(first)
    with pytest.raises(RewardContractError):  # restarted once, lies again, killed again
        backend.compute_rewards(two)
    with pytest.raises(ScorerCrashLoop):
        backend.compute_rewards(two)


def test_restart_policy_is_validated():
    from pydantic import ValidationError

    from supervisor import RestartPolicy

    with pytest.raises(ValidationError, match="max_restarts"):
        RestartPolicy(max_restarts=-1)
    with pytest.raises(ValidationError, match="window_s"):
        RestartPolicy(window_s=0)


def test_a_crash_loop_stops_for_good_not_for_one_window(managed, trainer_python):
    backend = managed(
        trainer_python,
        "tests.helpers.fixture_scorers:Probe",
        restart={"max_restarts": 0, "backoff_s": 0, "window_s": 0.2},
    )
    crash(backend)
    with pytest.raises(ScorerCrashLoop):
        backend.compute_rewards(REQUEST)
    time.sleep(0.3)  # the policy window has passed: still stopped
    with pytest.raises(ScorerCrashLoop):
        backend.compute_rewards(REQUEST)
    assert backend.restarts == 0


def test_a_child_restarted_under_another_identity_is_refused_before_it_scores_and_never_again(
    managed, trainer_python, tmp_path
):
    """A restart that boots another scorer identity (its env rebuilt, a file its params read
    changed) is stopped at its readiness line, before it scores anything, and the backend stays down
    with `ScorerIdentityChanged`: every later start would boot the same other identity."""
    from supervisor import ScorerIdentityChanged

    stamp = tmp_path / "stamp"
    stamp.write_text("1.0")
    mark = tmp_path / "scored"  # touched by any call of an item "hang" (hang_s 0: it does not hang)
    backend = managed(
        trainer_python, "tests.helpers.stamped_scorer:Stamped",
        params={"stamp_file": str(stamp), "hang_mark": str(mark)},
        restart={"backoff_s": 0},
    )  # fmt: skip
    assert backend.compute_rewards(REQUEST).rewards == [1.0]
    expected = backend.identity_hash
    stamp.write_text("2.0")
    crash(backend)
    with pytest.raises(ScorerIdentityChanged) as changed:
        backend.compute_rewards(RewardRequest(items=[RewardItem(id="a", text="hang")]))
    assert not mark.exists()  # the restarted child never scored it
    assert changed.value.expected == expected and changed.value.got not in (None, expected)
    restarted = changed.value.record.pid if changed.value.record is not None else None
    with pytest.raises(ScorerIdentityChanged):  # not started again
        backend.compute_rewards(REQUEST)
    assert backend.restarts == 1 and (restarted is None or not alive(restarted))


def test_a_late_call_killed_by_its_caller_counts_against_the_restart_policy(
    managed, trainer_python, tmp_path
):
    """`kill_late_call` (a Ray pool's actor cancelling a share past its call's deadline) kills the
    child as a timeout of our own does: the restart counts, so a scorer that hangs on every call
    ends in `ScorerCrashLoop`, not in a restart per call (`interrupt`, for a caller that gave up,
    does not count)."""
    journal = tmp_path / "journal"
    backend = managed(
        trainer_python, "tests.helpers.fixture_scorers:Journal",
        params={"path": str(journal), "sleep_s": 60},
        restart={"backoff_s": 0, "max_restarts": 1},
    )  # fmt: skip

    def late_call_killed(n: int) -> None:
        failed: list[ScorerError] = []

        def call() -> None:
            with pytest.raises(ScorerError) as raised:
                backend.compute_rewards(
                    RewardRequest(items=[RewardItem(id=f"slow{n}", text="slow")])
                )
            failed.append(raised.value)

        caller = threading.Thread(target=call)
        caller.start()
        # it is scoring
        assert eventually(lambda: journal.exists() and f"slow{n}" in journal.read_text(), 30)
        victim = backend.pid
        backend.kill_late_call()
        caller.join(30)
        assert failed and wait_until_gone([victim], 5) == []

    late_call_killed(0)
    assert backend.compute_rewards(REQUEST).rewards == [1.0] and backend.restarts == 1
    late_call_killed(1)
    with pytest.raises(ScorerCrashLoop):
        backend.compute_rewards(REQUEST)
