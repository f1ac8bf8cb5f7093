"""One owner per child: forks of the trainer, Ctrl-C, and a trainer that ignores SIGCHLD."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from supervisor import RewardItem, RewardRequest, ScorerProcessDied, ScorerStartupError
from supervisor.process import ChildProcess
from tests.conftest import REPO_ROOT, alive, wait_until_gone

REQUEST = RewardRequest(items=[RewardItem(id="a", text="abc")])


def run_script(module: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", module, *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout
    )


def test_a_forked_copy_of_the_trainer_never_acts_on_the_child(trainer_python):
    """DataLoader workers and checkpoint writers fork the trainer and exit through sys.exit: the copy's
    calls are refused naming the owner, and its close, garbage collection and at-exit hooks leave the
    owner's child alone."""
    done = run_script("tests.forking_trainer", str(trainer_python))
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.splitlines()[-1])
    assert f"belongs to pid {report['owner']}" in report["fork_saw"] and "is a fork of it" in report["fork_saw"]
    assert report["fork_status"] == [0, 0]
    assert report["first"] == report["after"] == [1.0]
    assert report["pid_after"] == report["pid_before"] and report["restarts"] == 0
    assert wait_until_gone([report["pid_before"]], 5) == []


def test_a_fork_during_launch_does_not_stall_boot(managed, trainer_python, monkeypatch):
    """A process forked while the child starts holds the write end of the child's stdin for as long as
    it lives; the framed boot config means the child stops reading at its end, not at end-of-input."""
    forks: list[int] = []
    spawn = ChildProcess._spawn

    def spawn_then_fork(self: ChildProcess, listen_fd: int, ready_w: int) -> None:
        spawn(self, listen_fd, ready_w)
        pid = os.fork()
        if pid == 0:  # a long-lived process forked from the launching trainer
            time.sleep(60)
            os._exit(0)
        forks.append(pid)

    monkeypatch.setattr(ChildProcess, "_spawn", spawn_then_fork)
    try:
        backend = managed(trainer_python, "constant", process={"startup_timeout": 30})
        assert forks and alive(forks[0])  # the fork still holds the pipe
        assert backend.compute_rewards(REQUEST).rewards == [1.0]
        assert backend.timings["spawn_to_ready_s"] < 15  # well inside startup_timeout, not at it
    finally:
        for pid in forks:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)


@pytest.mark.slow
def test_ctrl_c_mid_batch_exits_at_once_with_one_clean_traceback(trainer_python):
    """One SIGINT while the child works on a 60 s batch: the abandoned call kills the child, and
    close() (shutdown_timeout 10 s) skips the graceful path that would wait for it."""
    trainer = subprocess.Popen(
        [sys.executable, "-m", "tests.interrupted_trainer", str(trainer_python)],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        child = json.loads(trainer.stdout.readline())["child"]
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
    assert wait_until_gone([child], 5) == []
    assert stderr.count("Traceback (most recent call last)") == 1, stderr
    assert stderr.rstrip().endswith("KeyboardInterrupt") and "During handling" not in stderr, stderr
    assert to_exit < 2.0, f"Ctrl-C took {to_exit:.2f} s to exit"


def test_an_interrupted_call_kills_the_child_and_the_next_call_gets_a_new_one(managed, trainer_python, monkeypatch):
    backend = managed(trainer_python, "tests.fixture_scorers:Probe", restart={"max_restarts": 0})
    first = backend.pid

    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(backend._gen.client.transport, "request", interrupted)
    with pytest.raises(KeyboardInterrupt):
        backend.compute_rewards(REQUEST)
    assert wait_until_gone([first], 5) == []
    monkeypatch.undo()
    assert backend.compute_rewards(REQUEST).rewards == [3.0]  # not a crash: max_restarts=0 does not apply
    assert backend.pid != first and backend.restarts == 0


def test_a_trainer_that_ignores_sigchld_still_gets_true_exit_statuses(managed, trainer_python):
    """With SIGCHLD ignored the kernel reaps children at once and Popen reports them as "exit 0";
    the status comes from the child's pidfd instead, and a boot failure keeps its reserved code."""
    previous = signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    try:
        backend = managed(trainer_python, "tests.fixture_scorers:Probe", restart={"backoff_s": 0})
        pid = backend.pid
        os.kill(pid, signal.SIGKILL)
        assert wait_until_gone([pid], 5) == []
        with pytest.raises(ScorerProcessDied) as died:
            backend.compute_rewards(REQUEST)
        assert died.value.signal_name == "SIGKILL" and "status=signal SIGKILL" in str(died.value)
        assert backend.compute_rewards(REQUEST).rewards == [3.0]
        with pytest.raises(ScorerStartupError) as boot:
            managed(trainer_python, "no_such_scorer")
        assert boot.value.boot_code == 3 and boot.value.returncode == 3
        assert "exit 3 (bad boot config)" in str(boot.value)
    finally:
        signal.signal(signal.SIGCHLD, previous)
