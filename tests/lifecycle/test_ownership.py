"""One owner per child: forks of the trainer, Ctrl-C, and a trainer that ignores SIGCHLD."""

from __future__ import annotations

import gc
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from bench.hardening import fork_after_every_pipe, forks_during_launch
from supervisor import (
    RewardItem,
    RewardRequest,
    ScorerProcessDied,
    ScorerStartupError,
    ScorerUnavailable,
)
from supervisor.child.process import pidfd_exit_status
from tests.conftest import REPO_ROOT, alive, wait_until_gone

REQUEST = RewardRequest(items=[RewardItem(id="a", text="abc")])


def run_script(module: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_a_forked_copy_of_the_trainer_never_acts_on_the_child(trainer_python):
    """DataLoader workers and checkpoint writers fork the trainer and exit through sys.exit: the
    copy's calls are refused naming the owner, and its close, garbage collection and at-exit hooks
    leave the owner's child alone."""
    done = run_script("tests.helpers.forking_trainer", str(trainer_python))
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.splitlines()[-1])
    called, submitted = report["fork_saw"].split(" | ")
    assert f"belongs to pid {report['owner']}" in called and "is a fork of it" in called
    assert submitted.startswith("submit: ") and f"belongs to pid {report['owner']}" in submitted
    assert report["fork_status"] == [0, 0]
    assert report["first"] == report["after"] == [1.0]
    assert report["pid_after"] == report["pid_before"] and report["restarts"] == 0
    assert wait_until_gone([report["pid_before"]], 5) == []


def test_a_fork_during_launch_does_not_stall_boot(managed, trainer_python):
    """A process forked while the child starts holds the write end of the child's stdin for as long
    as it lives; the framed boot config means the child stops reading at its end, not at
    end-of-input."""
    with forks_during_launch() as forks:
        backend = managed(trainer_python, "constant", process={"startup_timeout": 30})
        assert forks and alive(forks[0])  # the fork still holds the pipe
        assert backend.compute_rewards(REQUEST).rewards == [1.0]
        assert backend.timings["spawn_to_ready_s"] < 15  # well inside startup_timeout, not at it


@pytest.mark.slow
@pytest.mark.parametrize(
    "mode, via",
    [
        ("backend", "call"),
        ("panel", "call"),
        ("panel-local", "call"),
        ("backend", "submit"),
        ("backend", "async"),
        ("panel", "submit"),
        ("replicas", "async"),
        ("backend", "stream"),
    ],
)
def test_ctrl_c_mid_batch_exits_at_once_with_one_clean_traceback(trainer_python, mode, via):
    """One SIGINT while the child works on a 60 s batch: the abandoned call kills the child, and
    close() (shutdown_timeout 10 s) skips the graceful path that would wait for it. A panel whose
    two children score concurrently (from its threads) does the same for both, and does not wait for
    an in-process term's call, which nothing can stop early. The same when the trainer waits in
    `submit(...).result()` or `asyncio.run(compute_rewards_async(...))`: the call sits in the
    submission worker, and the wait that Ctrl-C ends abandons it."""
    extra = ([f"--{mode}"] if mode != "backend" else []) + ["--via", via]
    trainer = subprocess.Popen(
        [sys.executable, "-m", "tests.helpers.interrupted_trainer", str(trainer_python), *extra],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        announced = json.loads(trainer.stdout.readline())
        children = announced["children"] if mode != "backend" else [announced["child"]]
        started = time.monotonic()
        trainer.send_signal(signal.SIGINT)
        trainer.wait(10)
        to_exit = time.monotonic() - started
        stderr = trainer.stderr.read()
    finally:
        trainer.kill()
        trainer.wait()
        trainer.stdout.close()
        trainer.stderr.close()
    assert len(children) == (2 if mode in ("panel", "replicas") else 1)
    assert wait_until_gone(children, 5) == []
    # asyncio.run cancels the coroutine, then raises KeyboardInterrupt from the cancellation
    if via == "async":
        assert (
            stderr.count("Traceback (most recent call last)") == 2 and "CancelledError" in stderr
        ), stderr
    else:
        assert (
            stderr.count("Traceback (most recent call last)") == 1
            and "During handling" not in stderr
        ), stderr
    assert stderr.rstrip().endswith("KeyboardInterrupt") and "ignored SIGTERM" not in stderr, stderr
    # the graceful path it must skip would take 10 s (shutdown_timeout); the bound leaves a loaded
    # machine room
    assert to_exit < 5.0, f"Ctrl-C took {to_exit:.2f} s to exit"


def test_an_interrupted_call_kills_the_child_and_the_next_call_gets_a_new_one(
    managed, trainer_python, monkeypatch
):
    backend = managed(
        trainer_python, "tests.helpers.fixture_scorers:Probe", restart={"max_restarts": 0}
    )
    first = backend.pid

    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(backend._gen.client.transport, "request", interrupted)
    with pytest.raises(KeyboardInterrupt):
        backend.compute_rewards(REQUEST)
    assert wait_until_gone([first], 5) == []
    monkeypatch.undo()
    # not a crash: max_restarts=0 does not apply
    assert backend.compute_rewards(REQUEST).rewards == [3.0]
    assert backend.pid != first and backend.restarts == 0


def exit_status_survives_reaping() -> bool:
    """Whether this kernel keeps a reaped child's status on its pidfd (PIDFD_INFO_EXIT). Call it
    with SIGCHLD handled: ignored, the probe could be reaped before its pidfd exists."""
    probe = subprocess.Popen(["true"])
    pidfd = os.pidfd_open(probe.pid)
    try:
        probe.wait()
        return pidfd_exit_status(pidfd) == 0
    finally:
        os.close(pidfd)


def test_a_trainer_that_ignores_sigchld_still_gets_true_exit_statuses(managed, trainer_python):
    """With SIGCHLD ignored the kernel reaps children at once and Popen reports them as "exit 0";
    the status comes from the child's pidfd instead, and a boot failure keeps its reserved code."""
    kept_on_pidfd = exit_status_survives_reaping()
    previous = signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    try:
        backend = managed(
            trainer_python, "tests.helpers.fixture_scorers:Probe", restart={"backoff_s": 0}
        )
        pid = backend.pid
        os.kill(pid, signal.SIGKILL)
        assert wait_until_gone([pid], 5) == []
        with pytest.raises(ScorerProcessDied) as died:
            backend.compute_rewards(REQUEST)
        assert backend.compute_rewards(REQUEST).rewards == [3.0]
        with pytest.raises(ScorerStartupError) as boot:
            managed(trainer_python, "no_such_scorer")
        # said on the readiness pipe, on any kernel: never restarted
        assert boot.value.boot_code == 3
        if kept_on_pidfd:  # Linux 6.15+
            assert died.value.signal_name == "SIGKILL" and "status=signal SIGKILL" in str(
                died.value
            )
            assert boot.value.returncode == 3 and "exit 3 (bad boot config)" in str(boot.value)
        else:
            assert died.value.returncode is None and "status unknown" in str(died.value)
        assert "status=exit 0" not in str(died.value) + str(boot.value)
    finally:
        signal.signal(signal.SIGCHLD, previous)


def test_a_trainer_out_of_descriptors_does_not_condemn_its_child(managed, trainer_python):
    """A fresh connection that fails because *this* process has no descriptors left is not the
    child's fault: the call fails at once with ScorerUnavailable and the child keeps serving."""
    import resource

    backend = managed(trainer_python, "constant")
    pid = backend.pid
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    held = []
    # An earlier test's unreachable socket, finalised by a collection during the call, would hand
    # the call a descriptor (seen twice under CI load): collect first, and no collection until the
    # end.
    gc.collect()
    gc.disable()
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 8, hard))
        while True:
            try:
                held.append(os.open("/dev/null", os.O_RDONLY))
            except OSError:
                break
        with pytest.raises(ScorerUnavailable, match="in this process.*left serving"):
            backend.compute_rewards(REQUEST)
    finally:
        gc.enable()
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert backend.compute_rewards(REQUEST).rewards == [1.0]
    assert backend.pid == pid and backend.restarts == 0


def test_a_fault_in_the_trainer_mid_call_kills_the_child_and_counts_as_a_failure(
    managed, trainer_python, monkeypatch
):
    """Only Ctrl-C (a BaseException) abandons a call for free; any other exception mid-exchange
    leaves the child's state unknown: it is killed, the call raises a ScorerError, the restart
    policy counts it."""
    backend = managed(
        trainer_python,
        "tests.helpers.fixture_scorers:Probe",
        restart={"max_restarts": 1, "backoff_s": 0},
    )
    first = backend.pid

    def out_of_memory(*args: object, **kwargs: object) -> None:
        raise MemoryError

    monkeypatch.setattr(backend._gen.client.transport, "request", out_of_memory)
    with pytest.raises(ScorerProcessDied, match="failed in this process: MemoryError"):
        backend.compute_rewards(REQUEST)
    assert wait_until_gone([first], 5) == []
    monkeypatch.undo()
    assert backend.compute_rewards(REQUEST).rewards == [3.0] and backend.restarts == 1


def test_a_fork_during_launch_does_not_hide_a_failing_boot(managed, trainer_python):
    """The fork holds the readiness pipe too: the child's exit is seen on its pidfd, not at the
    deadline."""
    with forks_during_launch(), pytest.raises(ScorerStartupError) as info:
        managed(
            trainer_python,
            "tests.helpers.fixture_scorers:ExitsOnLoad",
            process={"startup_timeout": 30},
        )
    assert info.value.returncode == 17 and "exited while starting" in str(info.value)


def test_ctrl_c_during_the_graceful_shutdown_still_stops_the_child(
    managed, trainer_python, monkeypatch
):
    backend = managed(trainer_python, "constant")
    pid = backend.pid

    def interrupted(timeout_s: float) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(backend._gen.client, "shutdown", interrupted)
    with pytest.raises(KeyboardInterrupt):
        backend.close()
    assert wait_until_gone([pid], 5) == []


def test_a_constructor_that_raises_is_reported_on_the_pipe(managed, trainer_python):
    with pytest.raises(ScorerStartupError) as info:
        managed(trainer_python, "tests.helpers.fixture_scorers:ConstructorRaises")
    assert info.value.boot_code == 6 and "no GPU driver loaded" in str(info.value)


def test_a_launch_is_not_held_up_by_a_fork_that_holds_its_pipes(managed, trainer_python):
    """A worker forked by another thread while the child spawns (here: after every pipe the launch
    opens, the worst moment) lives 8 s holding copies of those pipes. The spawn does not wait for it
    (Popen read its exec-status pipe until the fork exited): the launch is back while every fork
    still holds its pipes (an order, not a time a loaded machine could stretch)."""
    with fork_after_every_pipe() as forks:
        backend = managed(trainer_python, "constant", process={"startup_timeout": 30})
        holding = [pid for pid in forks if alive(pid)]
    assert forks and holding == forks
    assert backend.compute_rewards(REQUEST).rewards == [1.0]
