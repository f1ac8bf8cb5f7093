"""GPU residency state machine on CPU, with real children."""

from __future__ import annotations

import os
import signal
import threading

import pytest

from supervisor import (
    RewardItem,
    RewardRequest,
    ScorerProcessDied,
    ScorerRequestError,
    ScorerStartupError,
)
from tests.conftest import wait_in_flight, wait_until_gone
from tests.helpers.fixture_scorers import journal_calls

REQUEST = RewardRequest(items=[RewardItem(id="a", text="abcd")])


def test_resident_transitions_are_idempotent_and_gate_scoring(managed, trainer_python):
    backend = managed(trainer_python, "tests.helpers.fixture_scorers:Probe")
    assert backend.health()["residency"] == "resident"
    assert backend.onload() == {"residency": "resident", "changed": False}
    assert backend.offload() == {"residency": "offloaded", "changed": True}
    assert backend.offload() == {"residency": "offloaded", "changed": False}
    with pytest.raises(ScorerRequestError) as info:
        backend.compute_rewards(REQUEST)
    assert info.value.status == 409 and "POST /onload first" in str(info.value)
    assert backend.onload() == {"residency": "resident", "changed": True}
    assert backend.compute_rewards(REQUEST).rewards == [4.0]


def test_per_call_boots_offloaded_and_returns_offloaded(managed, trainer_python):
    backend = managed(
        trainer_python, "tests.helpers.fixture_scorers:Probe", gpu_residency="per_call"
    )
    assert backend.health()["residency"] == "offloaded"
    for _ in range(2):
        assert backend.compute_rewards(REQUEST).rewards == [4.0]
        assert backend.health()["residency"] == "offloaded"


def test_per_call_is_refused_before_weights_load_for_a_scorer_without_offload(
    managed, trainer_python, tmp_path
):
    marker = tmp_path / "loaded"
    with pytest.raises(ScorerStartupError) as info:
        managed(
            trainer_python,
            "tests.helpers.fixture_scorers:NoOffloadMarksLoad",
            params={"marker": str(marker)},
            gpu_residency="per_call",
        )
    assert info.value.returncode == 3
    assert "needs a scorer that supports offload" in str(info.value)
    assert not marker.exists(), "load() ran although per_call was refusable from the spec"


def test_offload_of_a_scorer_without_offload_support_says_so(managed, trainer_python, tmp_path):
    backend = managed(
        trainer_python,
        "tests.helpers.fixture_scorers:NoOffloadMarksLoad",
        params={"marker": str(tmp_path / "m")},
    )
    assert backend.offload() == {
        "residency": "resident",
        "changed": False,
        "supports_offload": False,
    }
    assert backend.compute_rewards(REQUEST).rewards == [0.5]


def test_offload_then_a_crash_restarts_what_the_child_reported(managed, trainer_python, tmp_path):
    """verl-style trainers offload around every step. A scorer that cannot offload stays resident,
    so after a crash its restarted child must boot resident too: never offloaded, answering every
    score 409."""
    backend = managed(
        trainer_python,
        "tests.helpers.fixture_scorers:NoOffloadMarksLoad",
        params={"marker": str(tmp_path / "m")},
        restart={"backoff_s": 0},
    )
    backend.offload()
    crashed = backend.pid
    os.kill(crashed, signal.SIGKILL)
    assert wait_until_gone([crashed], 5) == []
    with pytest.raises(ScorerProcessDied):
        backend.compute_rewards(REQUEST)
    assert backend.compute_rewards(REQUEST).rewards == [0.5] and backend.pid != crashed
    assert backend.health()["residency"] == "resident"


def test_a_restarted_child_boots_offloaded_only_after_a_real_offload(managed, trainer_python):
    backend = managed(
        trainer_python, "tests.helpers.fixture_scorers:Probe", restart={"backoff_s": 0}
    )
    assert backend.offload()["residency"] == "offloaded"
    crashed = backend.pid
    os.kill(crashed, signal.SIGKILL)
    assert wait_until_gone([crashed], 5) == []
    with pytest.raises(ScorerProcessDied):
        backend.compute_rewards(REQUEST)
    with pytest.raises(ScorerRequestError) as info:  # restarted as the trainer left it: offloaded
        backend.compute_rewards(REQUEST)
    assert info.value.status == 409 and backend.pid != crashed
    assert backend.onload()["residency"] == "resident" and backend.compute_rewards(
        REQUEST
    ).rewards == [4.0]


@pytest.mark.parametrize("operation", ["offload", "drain"])
def test_offload_and_drain_wait_for_the_running_score(managed, trainer_python, tmp_path, operation):
    """The scorer journals its call as the call ends (after its 1.5 s): the line is there when
    offload or drain returns. The order is read in the child, not from two threads' clocks in the
    trainer."""
    journal = tmp_path / "calls"
    params = {"sleep_s": 1.5, "journal": str(journal)}
    backend = managed(trainer_python, "tests.helpers.fixture_scorers:Probe", params=params)
    scored: list[list[float]] = []
    worker = threading.Thread(
        target=lambda: scored.append(backend.compute_rewards(REQUEST).rewards)
    )
    worker.start()
    wait_in_flight(backend)
    result = getattr(backend, operation)()
    ended = journal_calls(str(journal)) if journal.exists() else []  # read the moment it returned
    worker.join(timeout=30)
    assert [ids for _, ids in ended] == [["a"]], "returned while the score was still running"
    assert scored == [[4.0]]
    if operation == "offload":
        assert result == {"residency": "offloaded", "changed": True}
    else:
        assert result == {"drained": 1}


def test_a_failed_onload_leaves_residency_unknown_and_scoring_refused(managed, trainer_python):
    backend = managed(trainer_python, "tests.helpers.fixture_scorers:OnloadFailsOnce")
    backend.offload()
    with pytest.raises(ScorerRequestError, match="CUDA out of memory"):
        backend.onload()
    assert backend.health()["residency"] == "unknown"
    with pytest.raises(ScorerRequestError) as info:
        backend.compute_rewards(REQUEST)
    assert info.value.status == 409 and "residency is unknown" in str(info.value)
    assert backend.onload()["residency"] == "resident"  # a retry recovers
    assert backend.compute_rewards(REQUEST).rewards == [1.0]
