"""The fault matrix: each fault, the typed error it raises, and how fast service comes back.

`.venv/bin/python -m bench.fault_matrix` prints the table kept in docs/reliability.md;
tests/lifecycle/test_fault_matrix.py runs the same scenarios and asserts on them.
"""

from __future__ import annotations

import os
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psutil

from bench.handles import pid_of
from supervisor import ManagedScorerProcessBackend, RewardItem, RewardService

ROOT = Path(__file__).resolve().parent.parent
TRAINER_PYTHON = sys.executable
MATH_PYTHON = str(ROOT / "envs" / "math" / ".venv" / "bin" / "python")


def items(*texts: str) -> list[RewardItem]:
    return [RewardItem(id=f"s{i}", text=t, reference="2") for i, t in enumerate(texts)]


def rogue_python(directory: Path, python: str | Path) -> Path:
    """A `python` that puts tests/helpers/rogue_root first on the child's path: its child_runtime
    answers for the wrong ids, to show that the parent refuses such answers."""
    wrapper = directory / "rogue-python"
    wrapper.write_text(
        f'#!/bin/sh\nPYTHONPATH="{ROOT / "tests" / "helpers" / "rogue_root"}:$PYTHONPATH" '
        f'exec "{python}" "$@"\n'
    )
    wrapper.chmod(0o755)
    return wrapper


def backend(
    name: str,
    python: str | Path = TRAINER_PYTHON,
    process: dict | None = None,
    scorer: dict | None = None,
) -> ManagedScorerProcessBackend:
    return ManagedScorerProcessBackend(
        {
            "process": {
                "python_executable": python,
                "request_timeout": 30,
                "extra_import_paths": [str(ROOT)],
                **(process or {}),
            },
            "scorer": {"name": name, **(scorer or {})},
            "restart": {"backoff_s": 0.2},
        }
    )


def kill_when_in_flight(owner: ManagedScorerProcessBackend, pid: int) -> threading.Thread:
    def run() -> None:
        deadline = time.monotonic() + 10
        while owner.health()["in_flight"] == 0 and time.monotonic() < deadline:
            time.sleep(0.005)
        os.kill(pid, signal.SIGKILL)

    thread = threading.Thread(target=run)
    thread.start()
    return thread


@dataclass
class Fault:
    name: str
    make: Callable[[], ManagedScorerProcessBackend]
    inject: Callable[[ManagedScorerProcessBackend], object]  # before the failing call
    failing: list[RewardItem]
    expected: str  # exception class name
    healthy: list[RewardItem]  # the next call, expected to be served; [] where it cannot be
    healthy_rewards: list[float]
    kill_during: bool = False  # SIGKILL the child once the failing call is in flight


def _kill_child(b: ManagedScorerProcessBackend) -> None:
    """SIGKILL and wait until it is a zombie; never reap it (that is the owner's job)."""
    os.kill(pid_of(b), signal.SIGKILL)
    deadline = time.monotonic() + 5
    while (
        psutil.Process(pid_of(b)).status() != psutil.STATUS_ZOMBIE and time.monotonic() < deadline
    ):
        time.sleep(0.005)


def _kill_worker(b: ManagedScorerProcessBackend) -> None:
    child = psutil.Process(b.pid)
    workers = [p for p in child.children(recursive=True) if p.ppid() != b.pid]
    os.kill(workers[0].pid, signal.SIGKILL)


def _score_then_kill_child(b: ManagedScorerProcessBackend) -> None:
    RewardService(b).score_and_attach(items("warm"))
    _kill_child(b)


def _warm_then_kill_worker(b: ManagedScorerProcessBackend) -> None:
    RewardService(b).score_and_attach(items("\\boxed{2}"))
    _kill_worker(b)


PROBE = "tests.helpers.fixture_scorers:Probe"
FLAKY = "tests.helpers.fixture_scorers:Flaky"
FAULTS = [
    Fault(
        "kill -9 child before a request",
        lambda: backend(PROBE),
        _kill_child,
        items("abc"),
        "ScorerProcessDied",
        items("abc"),
        [3.0],
    ),
    Fault(
        "kill -9 child during a request",
        lambda: backend(FLAKY),
        lambda b: None,
        items("slow"),
        "ScorerProcessDied",
        items("abc"),
        [3.0],
        kill_during=True,
    ),
    Fault(
        "kill -9 child after a request",
        lambda: backend(PROBE),
        _score_then_kill_child,
        items("abc"),
        "ScorerProcessDied",
        items("abc"),
        [3.0],
    ),
    Fault(
        "kill -9 a math grading worker",
        lambda: backend(
            "math_verify", MATH_PYTHON, scorer={"params": {"jobs": 2, "timeout_s": 10}}
        ),
        _warm_then_kill_worker,
        items("\\boxed{2}", "\\boxed{3}"),
        "ScorerRequestError",
        items("\\boxed{2}"),
        [1.0],
    ),
    Fault(
        "SIGSTOP child (hung), deadline 1 s",
        lambda: backend(PROBE, process={"request_timeout": 1.0}),
        lambda b: os.kill(pid_of(b), signal.SIGSTOP),
        items("abc"),
        "ScorerTimeout",
        items("abc"),
        [3.0],
    ),
    Fault(
        "scorer raises",
        lambda: backend(FLAKY),
        lambda b: None,
        items("raise"),
        "ScorerRequestError",
        items("abc"),
        [3.0],
    ),
    Fault(
        "scorer returns NaN",
        lambda: backend(FLAKY),
        lambda b: None,
        items("nan", "x"),
        "ScorerRequestError",
        items("abc"),
        [3.0],
    ),
    Fault(
        "scorer returns the wrong count",
        lambda: backend(FLAKY),
        lambda b: None,
        items("count", "x"),
        "ScorerRequestError",
        items("abc"),
        [3.0],
    ),
    Fault(
        "child echoes wrong ids",
        lambda: backend(PROBE, rogue_python(Path(tempfile.mkdtemp()), TRAINER_PYTHON)),
        lambda b: None,
        items("a", "bb"),
        "RewardContractError",
        [],
        [],
    ),
]


@dataclass
class Outcome:
    error: BaseException
    to_error_s: float
    to_served_s: float | None  # the next call after the failure; None where it cannot be served
    pid_before: int
    pid_after: int | None
    before_alive: bool

    @property
    def child(self) -> str:
        if self.pid_after != self.pid_before:
            return "restarted"
        return "kept serving" if self.before_alive else "killed"


def run(fault: Fault) -> Outcome:
    """Inject, make the failing call through RewardService, then the next call."""
    owner = fault.make()
    try:
        fault.inject(owner)
        pid_before, service = pid_of(owner), RewardService(owner)
        killer = kill_when_in_flight(owner, pid_before) if fault.kill_during else None
        started = time.monotonic()
        try:
            service.score_and_attach(fault.failing)
        except Exception as exc:  # noqa: BLE001 - the outcome under test
            error, to_error = exc, time.monotonic() - started
        else:
            raise AssertionError(f"{fault.name}: the failing call returned rewards")
        finally:
            if killer is not None:
                killer.join()
        to_served = None
        if fault.healthy:
            started = time.monotonic()
            scored = service.score_and_attach(fault.healthy)
            to_served = time.monotonic() - started
            assert [item.reward for item in scored] == fault.healthy_rewards, fault.name
        before_alive = (
            psutil.pid_exists(pid_before)
            and psutil.Process(pid_before).status() != psutil.STATUS_ZOMBIE
        )
        return Outcome(error, to_error, to_served, pid_before, owner.pid, before_alive)
    finally:
        owner.close()


def main() -> None:
    print("| fault | typed error | time to error | next call | the child |\n|---|---|---|---|---|")
    for fault in FAULTS:
        outcome = run(fault)
        served = (
            f"{outcome.to_served_s:.3f} s"
            if outcome.to_served_s is not None
            else "not tried (a new child would lie again)"
        )
        print(
            f"| {fault.name} | {type(outcome.error).__name__} | {outcome.to_error_s:.3f} s | "
            f"{served} | {outcome.child} |"
        )


if __name__ == "__main__":
    main()
