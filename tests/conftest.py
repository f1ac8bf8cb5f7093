"""Shared fixtures: real scorer envs, backends that always close, and a process-leak guard."""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
LEAK_GRACE_S = 5.0


def env_python(name: str) -> Path:
    """The python of a scorer env built by `make env-NAME`; a missing env is an error, not a
    skip."""
    python = REPO_ROOT / "envs" / name / ".venv" / "bin" / "python"
    if not python.exists():
        pytest.fail(f"{python} is missing: run `make env-{name}` (make test builds every env)")
    return python


def launcher_free_env(**extra: str) -> dict[str, str]:
    """This environment without a launcher's rank variables or PYTHONPATH: what a trainer rank
    starts from."""
    drop = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "PYTHONPATH"}
    return {k: v for k, v in os.environ.items() if k not in drop} | extra


@pytest.fixture
def math_python() -> Path:
    return env_python("math")


@pytest.fixture
def image_python() -> Path:
    return env_python("image")


@pytest.fixture
def trainer_python() -> Path:
    """The trainer env itself has starlette/uvicorn: good enough to host rule and test scorers."""
    return Path(sys.executable)


def _descendants(exempt: Iterable[int] = ()) -> dict[int, float]:
    """This process's descendants, less those of the `exempt` pids."""
    me = psutil.Process()
    skipped: set[int] = set()
    for pid in exempt:
        try:
            skipped.update(child.pid for child in psutil.Process(pid).children(recursive=True))
        except psutil.NoSuchProcess:
            continue
    found = {}
    for child in me.children(recursive=True):
        try:
            if child.pid not in skipped:
                found[child.pid] = child.create_time()
        except psutil.NoSuchProcess:
            continue
    return found


def alive(pid: int, created: float | None = None) -> bool:
    """True if `pid` is running and not a zombie (and is the same process when `created` is
    given)."""
    try:
        proc = psutil.Process(pid)
        if created is not None and abs(proc.create_time() - created) > 0.01:
            return False
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def wait_until_gone(pids: dict[int, float] | list[int], timeout: float) -> list[int]:
    """Poll until every pid is gone; returns the survivors at the deadline."""
    items = pids.items() if isinstance(pids, dict) else [(p, None) for p in pids]
    deadline = time.monotonic() + timeout
    while True:
        survivors = [pid for pid, created in items if alive(pid, created)]
        if not survivors or time.monotonic() > deadline:
            return survivors
        time.sleep(0.05)


def wait_in_flight(backend: Any, deadline_s: float = 10.0) -> None:
    """Block until the child reports a score request in flight (bounded)."""
    deadline = time.monotonic() + deadline_s
    while backend.health()["in_flight"] == 0:
        assert time.monotonic() < deadline, "request never reached the child"
        time.sleep(0.01)


def eventually(predicate: Callable[[], bool], timeout: float = 10.0, every: float = 0.02) -> bool:
    """Poll `predicate` until it holds or `timeout` passes; returns its last value."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(every)
    return True


def run_in_threads(target: Callable[[int], None], count: int, timeout: float = 60.0) -> None:
    """target(0..count-1) in parallel threads; every thread must finish within `timeout`."""
    threads = [threading.Thread(target=target, args=(n,), name=f"worker-{n}") for n in range(count)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + timeout
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    assert not any(thread.is_alive() for thread in threads), "a worker thread outlived its deadline"


def group_members(pgid: int) -> list[int]:
    """Every live process in process group `pgid` (a child and all it spawned)."""
    members = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if os.getpgid(proc.pid) == pgid and proc.status() != psutil.STATUS_ZOMBIE:
                members.append(proc.pid)
        except (ProcessLookupError, psutil.NoSuchProcess):
            continue
    return members


@pytest.fixture(autouse=True)
def no_leaked_processes(request: pytest.FixtureRequest) -> Iterator[None]:
    """Every process a test starts must be gone when it ends (bounded wait, then fail). A test
    module's `LONG_LIVED` pids (a module-wide server whose scorer keeps processes ready, renewed
    as it works) have their descendants judged by that module once the server stops."""
    before = _descendants()
    yield
    exempt = set(getattr(request.module, "LONG_LIVED", ()))
    new = {pid: t for pid, t in _descendants(exempt).items() if pid not in before}
    survivors = wait_until_gone(new, LEAK_GRACE_S)
    for pid in survivors:
        try:
            psutil.Process(pid).kill()
        except psutil.NoSuchProcess:
            pass
    assert not survivors, f"processes outlived the test: {survivors}"


def managed_config(
    python: Path,
    scorer: str,
    input_kind: str = "text",
    params: dict | None = None,
    process: dict | None = None,
    client: dict | None = None,
    scorer_device: str = "cpu",
    **spec: Any,
) -> Any:
    """The spec of a test's managed child: this checkout importable, generous deadlines."""
    from supervisor import ManagedScorerProcessSpec

    return ManagedScorerProcessSpec(
        process={
            "python_executable": str(python),
            "startup_timeout": 60,
            "request_timeout": 60,
            "extra_import_paths": [str(REPO_ROOT)],
            **(process or {}),
        },
        scorer={
            "name": scorer,
            "input_kind": input_kind,
            "params": params or {},
            "device": scorer_device,
        },
        client={"input_kind": input_kind, **(client or {})},
        **spec,
    )


@pytest.fixture
def managed() -> Iterator[Callable[..., Any]]:
    """Factory for ManagedScorerProcessBackend that closes every backend it made."""
    from supervisor import ManagedScorerProcessBackend

    made = []

    def make(python: Path, scorer: str, *args: Any, **kwargs: Any):
        backend = ManagedScorerProcessBackend(
            managed_config(python, scorer, *args, **kwargs), start=False
        )
        made.append(backend)
        backend.start()
        return backend

    yield make
    for backend in made:
        backend.close()
