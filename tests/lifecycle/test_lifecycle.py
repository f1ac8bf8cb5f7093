"""Start-up failures, crashes, deadlines and teardown with real child processes."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import psutil
import pytest

from supervisor import (
    ConfigError,
    ManagedScorerProcessBackend,
    ManagedScorerProcessSpec,
    RewardItem,
    RewardRequest,
    ScorerProcessDied,
    ScorerRequestError,
    ScorerStartupError,
    ScorerTimeout,
)
from tests.conftest import REPO_ROOT, alive, group_members, wait_in_flight, wait_until_gone

REQUEST = RewardRequest(items=[RewardItem(id="a", text="abc")])


@pytest.mark.parametrize(
    "scorer,returncode,needle",
    [
        ("tests.helpers.fixture_scorers:ExitsOnLoad", 17, "exit 17"),
        (
            "tests.helpers.fixture_scorers:LoadFails",
            6,
            "weights file /models/missing.safetensors not found",
        ),
        ("no_such_scorer", 3, "unknown scorer 'no_such_scorer'"),
        ("no_such_module.sub:Thing", 4, "cannot import module 'no_such_module.sub'"),
    ],
)
def test_child_that_fails_to_boot_raises_with_status_and_log(
    managed, trainer_python, scorer, returncode, needle
):
    with pytest.raises(ScorerStartupError) as info:
        managed(trainer_python, scorer)
    error = info.value
    assert "not ready within startup_timeout" not in str(error)  # the exit was seen, not waited out
    assert error.returncode == returncode
    assert error.pid is not None and not alive(error.pid)
    assert needle in str(error)
    assert error.record.log_path and Path(error.record.log_path).exists()


def test_bad_scorer_params_are_a_config_failure(managed, trainer_python):
    with pytest.raises(ScorerStartupError) as info:
        managed(trainer_python, "constant", params={"value": "high"})
    assert info.value.returncode == 3 and "value must be a finite number" in str(info.value)


def test_not_a_python_fails_at_once(managed, tmp_path):
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\necho 'no python here' >&2\nexit 9\n")
    fake.chmod(0o755)
    with pytest.raises(ScorerStartupError) as info:
        managed(fake, "constant")
    assert info.value.returncode == 9 and "no python here" in str(info.value)


def test_startup_timeout_kills_the_child(managed, trainer_python):
    started = time.monotonic()
    with pytest.raises(ScorerStartupError) as info:
        managed(
            trainer_python,
            "tests.helpers.fixture_scorers:LoadHangs",
            process={"startup_timeout": 1.5},
        )
    elapsed = time.monotonic() - started
    assert 1.5 <= elapsed < 6, elapsed
    assert "not ready within startup_timeout=1.5" in str(info.value)
    assert info.value.signal_name == "SIGKILL" and not alive(info.value.pid)


def test_required_reward_that_the_scorer_lacks_is_refused(managed, trainer_python):
    with pytest.raises(ConfigError, match="not terms of scorer"):
        managed(trainer_python, "constant", client={"required_rewards": ["constant", "aesthetic"]})


def test_kill_9_mid_request_raises_process_died_at_once(managed, trainer_python):
    backend = managed(
        trainer_python, "tests.helpers.fixture_scorers:Flaky", process={"request_timeout": 120}
    )
    pid = backend.pid
    killer = threading.Thread(
        target=lambda: (wait_in_flight(backend), os.kill(pid, signal.SIGKILL))
    )
    killer.start()
    started = time.monotonic()
    with pytest.raises(ScorerProcessDied) as info:
        # sleeps 30 s
        backend.compute_rewards(RewardRequest(items=[RewardItem(id="a", text="slow")]))
    elapsed = time.monotonic() - started
    killer.join()
    assert elapsed < 5, f"crash noticed after {elapsed:.1f} s (request timeout 120 s)"
    assert info.value.signal_name == "SIGKILL" and info.value.pid == pid
    assert "status=signal SIGKILL" in str(info.value)
    assert backend.compute_rewards(REQUEST).rewards == [3.0]  # the next call restarted the child
    assert backend.pid != pid and backend.restarts == 1


def test_kill_9_between_calls_is_noticed_before_sending(managed, trainer_python):
    backend = managed(trainer_python, "tests.helpers.fixture_scorers:Probe")
    assert backend.compute_rewards(REQUEST).rewards == [3.0]
    os.kill(backend.pid, signal.SIGKILL)
    assert wait_until_gone([backend.pid], 5) == []
    with pytest.raises(ScorerProcessDied) as info:
        backend.compute_rewards(REQUEST)
    assert info.value.signal_name == "SIGKILL"


def test_request_timeout_kills_the_hung_child(managed, trainer_python):
    backend = managed(
        trainer_python,
        "tests.helpers.fixture_scorers:Probe",
        params={"sleep_s": 60},
        process={"request_timeout": 1.0},
    )
    pid = backend.pid
    started = time.monotonic()
    with pytest.raises(ScorerTimeout) as info:
        backend.compute_rewards(REQUEST)
    assert time.monotonic() - started < 8
    assert info.value.pid == pid and not alive(pid)
    assert "no answer within 1.0 s" in str(info.value)


def test_close_is_graceful_bounded_and_idempotent(managed, trainer_python):
    backend = managed(trainer_python, "tests.helpers.fixture_scorers:Probe")
    pid = backend.pid
    backend.close()
    assert backend._child.returncode() == 0  # exited by /shutdown, not by a signal
    assert not alive(pid)
    backend.close()
    with pytest.raises(ScorerProcessDied, match="closed"):
        backend.compute_rewards(REQUEST)


def test_close_escalates_when_the_child_ignores_shutdown(managed, trainer_python):
    backend = managed(
        trainer_python,
        "tests.helpers.fixture_scorers:Probe",
        params={"sleep_s": 60},
        process={"shutdown_timeout": 1.0, "request_timeout": 120},
    )
    outcome: list[BaseException | None] = []

    def score() -> None:
        try:
            backend.compute_rewards(REQUEST)
            outcome.append(None)
        except ScorerProcessDied as exc:
            outcome.append(exc)

    worker = threading.Thread(target=score)
    worker.start()
    wait_in_flight(backend)
    os.kill(backend.pid, signal.SIGSTOP)  # hung hard: no /shutdown, no SIGTERM handling
    started = time.monotonic()
    backend.close()
    elapsed = time.monotonic() - started
    worker.join(timeout=10)
    assert not worker.is_alive() and isinstance(outcome[0], ScorerProcessDied), outcome
    assert elapsed < 1.0 + 0.7, elapsed  # one deadline for /shutdown, SIGTERM and SIGKILL
    assert backend._child.returncode() == -signal.SIGKILL
    assert group_members(backend.pid) == []


def test_second_start_is_refused(managed, trainer_python):
    backend = managed(trainer_python, "constant")
    with pytest.raises(RuntimeError, match="already started"):
        backend.start()


def test_child_sees_one_gpu_and_only_our_packages_first(managed, trainer_python, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7")
    monkeypatch.setenv("VIRTUAL_ENV", "/trainer/venv")
    backend = managed(trainer_python, "constant", process={"local_rank": 2})
    environ = psutil.Process(backend.pid).environ()
    assert environ["CUDA_VISIBLE_DEVICES"] == "6"
    root, extra = environ["PYTHONPATH"].split(os.pathsep)
    assert sorted(os.listdir(root)) == ["child_runtime", "scorers"] and extra == str(REPO_ROOT)
    assert environ["PYTHONSAFEPATH"] == "1" and environ["PYTHONNOUSERSITE"] == "1"
    assert "VIRTUAL_ENV" not in environ
    assert os.getpgid(backend.pid) == backend.pid  # own session / process group


def test_spec_from_plain_dict(trainer_python):
    spec = {"process": {"python_executable": str(trainer_python)}, "scorer": {"name": "constant"}}
    with ManagedScorerProcessBackend(spec) as backend:
        assert backend.compute_rewards(REQUEST).rewards == [1.0]
        pid = backend.pid
    assert not alive(pid)


def test_spec_type_is_reused(trainer_python):
    spec = ManagedScorerProcessSpec(
        process={"python_executable": str(trainer_python)}, scorer={"name": "nonempty"}
    )
    backend = ManagedScorerProcessBackend(spec)
    try:
        assert backend.spec is spec
        assert backend.compute_rewards(
            RewardRequest(items=[RewardItem(id="x", text="  ")])
        ).rewards == [0.0]
    finally:
        backend.close()


def test_child_that_never_reads_its_boot_config_fails_at_the_startup_deadline(managed, tmp_path):
    stuck = tmp_path / "python"
    stuck.write_text("#!/bin/sh\nexec sleep 60\n")  # a 'python' that never reads stdin
    stuck.chmod(0o755)
    started = time.monotonic()
    with pytest.raises(ScorerStartupError) as info:
        managed(stuck, "constant", params={"pad": "x" * 500_000}, process={"startup_timeout": 1.5})
    assert time.monotonic() - started < 6
    assert "did not read its boot config" in str(info.value)
    assert info.value.signal_name == "SIGKILL"


def test_a_file_that_cannot_execute_is_a_startup_error(managed, tmp_path):
    junk = tmp_path / "python"
    junk.write_bytes(b"\x00\x01 not an executable format")
    junk.chmod(0o755)
    with pytest.raises(ScorerStartupError, match="cannot execute"):
        managed(junk, "constant")


def test_input_kind_that_the_scorer_does_not_take_is_a_config_failure(managed, trainer_python):
    with pytest.raises(ScorerStartupError) as info:
        managed(trainer_python, "constant", input_kind="image")
    assert info.value.returncode == 3 and "takes 'text'" in str(info.value)


def test_unserialisable_diagnostics_are_a_typed_error_and_the_child_keeps_serving(
    managed, trainer_python
):
    backend = managed(trainer_python, "tests.helpers.fixture_scorers:BadDiagnostics")
    with pytest.raises(ScorerRequestError) as info:
        backend.compute_rewards(RewardRequest(items=[RewardItem(id="a", text="bad")]))
    assert info.value.status == 500 and info.value.kind == "contract"
    assert backend.compute_rewards(
        RewardRequest(items=[RewardItem(id="a", text="ok")])
    ).rewards == [2.0]


def test_threads_sharing_a_backend_are_served_in_turn_within_the_deadline(managed, trainer_python):
    """The child scores one batch at a time; queued calls must not eat the request deadline."""
    backend = managed(
        trainer_python,
        "tests.helpers.fixture_scorers:Probe",
        params={"sleep_s": 0.3},
        process={"request_timeout": 1.0},
    )
    results, errors = [], []

    def work(thread: int) -> None:
        for call in range(3):
            request = RewardRequest(
                items=[RewardItem(id=f"t{thread}c{call}", text="x" * (thread + 1))]
            )
            try:
                results.append((thread, backend.compute_rewards(request).rewards))
            except Exception as exc:  # noqa: BLE001 - collected and asserted below
                errors.append(exc)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert errors == []
    assert sorted(results) == sorted((t, [float(t + 1)]) for t in range(4) for _ in range(3))


def test_log_file_is_private_and_in_a_private_directory(managed, trainer_python, tmp_path):
    import stat

    log_dir = tmp_path / "logs"
    backend = managed(trainer_python, "constant", process={"log_dir": str(log_dir)})
    log_file = Path(backend.log_path)
    assert log_file.parent == log_dir
    assert stat.S_IMODE(log_file.stat().st_mode) == 0o600
    assert stat.S_IMODE(log_dir.stat().st_mode) == 0o700 and log_dir.stat().st_uid == os.getuid()


@pytest.mark.slow
def test_without_pidfd_open_exits_are_polled(managed, trainer_python, monkeypatch):
    """A sandbox without pidfd_open (ENOSYS: gVisor's older kernels, where GPU machines run): the
    child still boots, a kill -9 is still noticed with its status, and close() still ends it."""
    import errno

    from supervisor.child import process

    def no_pidfd(pid: int, flags: int = 0) -> int:
        raise OSError(errno.ENOSYS, "Function not implemented")

    monkeypatch.setattr(process.os, "pidfd_open", no_pidfd)
    backend = managed(
        trainer_python, "tests.helpers.fixture_scorers:Probe", restart={"backoff_s": 0}
    )
    request = RewardRequest(items=[RewardItem(id="a", text="abc")])
    assert backend.compute_rewards(request).rewards == [3.0]
    first = backend.pid
    os.kill(first, signal.SIGKILL)
    with pytest.raises(ScorerProcessDied, match="SIGKILL"):
        backend.compute_rewards(request)
    assert backend.compute_rewards(request).rewards == [3.0] and backend.pid != first  # restarted
    second = backend.pid
    backend.close()
    assert wait_until_gone([first, second], 5.0) == []


def test_an_interpreter_without_the_runtimes_packages_is_told_which_and_how_to_get_an_env(
    managed, tmp_path
):
    """A bare venv (no numpy): the child says on its readiness pipe which package it lacks and how
    to build an env, instead of dying at import with exit 1."""
    import subprocess
    import venv

    venv.EnvBuilder(with_pip=False).create(tmp_path / "bare")
    bare = tmp_path / "bare" / "bin" / "python"
    assert subprocess.run([str(bare), "-c", "import numpy"], capture_output=True).returncode != 0
    with pytest.raises(ScorerStartupError) as info:
        managed(bare, "constant")
    message = str(info.value)
    assert (
        info.value.boot_code == 3
        and "lacks 'numpy'" in message
        and "managed-scorers envs build" in message
    )
