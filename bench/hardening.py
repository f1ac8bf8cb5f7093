"""Adversarial scenarios, measured: `.venv/bin/python -m bench.hardening` prints one table row each.

The same scenarios are asserted by tests (test_ownership, test_gate, test_data_plane,
test_residency, test_logs); this prints the figures docs/reliability.md quotes. Real
children, real forks, real signals; the trainer is this process or a script under tests/.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

import numpy as np

from bench import (
    hardening_bodies,
    hardening_calls,
    hardening_identity,
    hardening_jobs,
    hardening_ray,
    hardening_stream,
    hardening_terms,
)
from bench.handles import child_of, client_of, pid_of, port_of, segment_of
from supervisor import (
    ManagedScorerProcessBackend,
    RewardItem,
    RewardRequest,
    ScorerError,
    ScorerStartupError,
    ScorerUnavailable,
)
from supervisor.child import process as process_module
from supervisor.child.process import ChildProcess

ROOT = Path(__file__).resolve().parent.parent
TRAINER = sys.executable
IMAGE = str(ROOT / "envs" / "image" / ".venv" / "bin" / "python")
TEXT = RewardRequest(items=[RewardItem(id="a", text="abc")])


def backend(name: str, python: str = TRAINER, **spec: object) -> ManagedScorerProcessBackend:
    process = {
        "python_executable": python,
        "extra_import_paths": [str(ROOT)],
        **spec.pop("process", {}),  # type: ignore[dict-item]
    }
    kind = "image" if python == IMAGE else "text"
    return ManagedScorerProcessBackend(
        {
            "process": process,
            "scorer": {"name": name, "input_kind": kind},
            "client": {"input_kind": kind},
            **spec,
        }
    )


def _pipe(stream: IO[str] | None) -> IO[str]:
    if stream is None:
        raise RuntimeError("the subprocess was started without this pipe")
    return stream


def timed(call: Callable[[], object]) -> tuple[object, float]:
    started = time.monotonic()
    result = call()
    return result, time.monotonic() - started


def gone(pid: int, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.01)
    return False


def fork_of_the_trainer() -> str:
    done = subprocess.run(
        [TRAINER, "-m", "tests.helpers.forking_trainer", TRAINER],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    report = json.loads(done.stdout.splitlines()[-1])
    kept = report["pid_after"] == report["pid_before"] and report["restarts"] == 0
    return (
        f"fork's call: BackendNotOwned; its close, GC and sys.exit left the child alone; "
        f"owner's next call served by the same child: {kept}"
    )


def connection_flood() -> str:
    was = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, was[1]))
    try:
        owner = backend("constant", limits={"pending_connection_timeout_s": 2.0})
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, was)
    try:
        baseline = len(os.listdir(f"/proc/{pid_of(owner)}/fd"))
        flood = subprocess.Popen(
            [TRAINER, "-m", "tests.helpers.flood_connections", "hold", str(port_of(owner)), "5000"],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        held = json.loads(_pipe(flood.stdout).readline())["held"]
        peak = baseline
        deadline = time.monotonic() + 30
        while owner.health()["connections"]["evicted"] < held - 64 and time.monotonic() < deadline:
            peak = max(peak, len(os.listdir(f"/proc/{pid_of(owner)}/fd")))
            time.sleep(0.01)
        client_of(owner).transport.http.drop_idle()  # type: ignore[attr-defined]  # a fresh connection
        rewards, call_s = timed(lambda: owner.compute_rewards(TEXT).rewards)
        started = time.monotonic()
        while owner.health()["connections"]["pending"] and time.monotonic() - started < 10:
            time.sleep(0.05)
        drained_s = time.monotonic() - started
        flood.kill()
        flood.wait()
        return (
            f"{held} idle connections at RLIMIT_NOFILE 1024: the child held at most "
            f"{peak - baseline} extra descriptors; next call {call_s * 1e3:.1f} ms, "
            f"{owner.restarts} restarts; the last pending ones closed {drained_s:.1f} s "
            f"later (timeout 2 s)"
        )
    finally:
        owner.close()


def rss_shmem(pid: int | str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("RssShmem:"):
            return int(line.split()[1]) << 10
    return 0


def large_request_then_idle() -> str:
    owner = backend("mean_intensity", IMAGE)
    try:
        small = RewardRequest(
            items=[
                RewardItem(id=f"s{i}", image=np.full((512, 512, 3), i, np.uint8)) for i in range(8)
            ]
        )
        owner.compute_rewards(small)
        before = rss_shmem("self"), rss_shmem(pid_of(owner))
        large = RewardRequest(
            items=[
                RewardItem(id=f"l{i}", image=np.full((4000, 4000, 3), 9, np.uint8))
                for i in range(4)
            ]
        )
        owner.compute_rewards(large)
        after = rss_shmem("self"), rss_shmem(pid_of(owner))
        mib = [f"{b / 2**20:.1f}" for b in (*before, *after)]
        return (
            f"192 MB request; RssShmem trainer {mib[0]} -> {mib[2]} MiB, child {mib[1]} -> "
            f"{mib[3]} MiB; {segment_of(owner).returned_bytes / 2**20:.0f} MiB of pages given back"
        )
    finally:
        owner.close()


def offload_then_crash() -> str:
    owner = backend("constant", restart={"backoff_s": 0})
    try:
        figures = owner.offload()
        os.kill(pid_of(owner), signal.SIGKILL)
        gone(pid_of(owner))
        try:
            owner.compute_rewards(TEXT)
        except ScorerError:
            pass
        rewards, served_s = timed(lambda: owner.compute_rewards(TEXT).rewards)
        return (
            f"offload of a scorer that cannot offload reports residency "
            f"{figures['residency']!r}; after kill -9 the restarted child scored {rewards} "
            f"in {served_s:.2f} s, residency {owner.health()['residency']!r}"
        )
    finally:
        owner.close()


@contextlib.contextmanager
def forks_during_launch(hold_s: float = 60.0) -> Iterator[list[int]]:
    """Inside the block, right after each child's spawn the launching process forks a copy that
    lives `hold_s` (holding the child's stdin, readiness pipe and listening socket), as a process
    that another thread forks at that moment would. The copies' pids are listed; they die on
    exit."""
    forks: list[int] = []
    spawn = ChildProcess._spawn

    def spawn_then_fork(self: ChildProcess, listen_fd: int, ready_w: int) -> None:
        spawn(self, listen_fd, ready_w)
        pid = os.fork()
        if pid == 0:
            time.sleep(hold_s)
            os._exit(0)
        forks.append(pid)

    ChildProcess._spawn = spawn_then_fork  # type: ignore[method-assign]
    try:
        yield forks
    finally:
        ChildProcess._spawn = spawn  # type: ignore[method-assign]
        for pid in forks:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)


@contextlib.contextmanager
def forking_thread(every_s: float = 0.01, live_s: float = 8.0) -> Iterator[list[int]]:
    """Inside the block, another thread of this process forks a worker every `every_s` that lives
    `live_s` (a DataLoader's workers, a checkpoint writer); the workers' pids are listed and all
    of them are killed and reaped on exit."""
    forks: list[int] = []
    stop = threading.Event()

    def fork_loop() -> None:
        while not stop.wait(every_s):
            pid = os.fork()
            if pid == 0:
                time.sleep(live_s)
                os._exit(0)
            forks.append(pid)

    thread = threading.Thread(target=fork_loop, name="forking-thread", daemon=True)
    thread.start()
    try:
        yield forks
    finally:
        stop.set()
        thread.join(5)
        for pid in forks:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)


@contextlib.contextmanager
def fork_after_every_pipe(live_s: float = 8.0) -> Iterator[list[int]]:
    """Inside the block, each `os.pipe()` in this process is followed by a fork that lives `live_s`
    holding both ends: the worst moment another thread's fork can land during a launch (Popen's
    exec-status pipe among them). The forks' pids are listed; they are killed and reaped on exit."""
    forks: list[int] = []
    make_pipe = os.pipe

    def pipe_then_fork() -> tuple[int, int]:
        ends = make_pipe()
        pid = os.fork()
        if pid == 0:
            time.sleep(live_s)
            os._exit(0)
        forks.append(pid)
        return ends

    os.pipe = pipe_then_fork
    try:
        yield forks
    finally:
        os.pipe = make_pipe
        for pid in forks:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)


def launches_beside_a_forking_thread(
    launches: int = 10, startup_timeout: float = 2.0
) -> tuple[list[float], int]:
    """Spawn-to-ready of `launches` children while another thread forks 8 s workers every 10 ms;
    how many of them failed to start within `startup_timeout`."""
    times, failed = [], 0
    with forking_thread():
        for _ in range(launches):
            started = time.monotonic()
            try:
                backend("constant", process={"startup_timeout": startup_timeout}).close()
            except ScorerStartupError:
                failed += 1
            times.append(time.monotonic() - started)
    return times, failed


def forking_thread_during_launch(launches: int = 10) -> str:
    times, failed = launches_beside_a_forking_thread(launches)
    return (
        f"{launches} launches (startup_timeout 2 s) while another thread forks an 8 s worker every "
        f"10 ms: "
        f"{failed} failed; construct-to-closed median {sorted(times)[len(times) // 2]:.2f} s, "
        f"slowest {max(times):.2f} s"
    )


def fork_during_launch() -> str:
    with forks_during_launch():
        owner = backend("constant", process={"startup_timeout": 30})
        ready_s = owner.timings["spawn_to_ready_s"]
        owner.close()
    plain = backend("constant")
    plain_s = plain.timings["spawn_to_ready_s"]
    plain.close()
    return (
        f"spawn-to-ready {ready_s:.2f} s with a fork holding the child's stdin (without: "
        f"{plain_s:.2f} s)"
    )


def ctrl_c() -> str:
    trainer = subprocess.Popen(
        [TRAINER, "-m", "tests.helpers.interrupted_trainer", TRAINER],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    stdout, stderr = _pipe(trainer.stdout), _pipe(trainer.stderr)
    child = json.loads(stdout.readline())["child"]
    started = time.monotonic()
    trainer.send_signal(signal.SIGINT)
    trainer.wait(15)
    to_exit = time.monotonic() - started
    tracebacks = stderr.read().count("Traceback (most recent call last)")
    stdout.close()
    stderr.close()
    return (
        f"SIGINT mid-batch (60 s batch, shutdown_timeout 10 s): trainer exited in {to_exit:.2f} s, "
        f"child gone: {gone(child)}, {tracebacks} traceback"
    )


def full_log_disk() -> str:
    tail = Path(tempfile.mkdtemp()) / "unwritten.log"
    tail.touch()
    opener = process_module.open_child_log
    process_module.open_child_log = lambda *args: (os.open("/dev/full", os.O_WRONLY), tail)
    try:
        started = time.monotonic()
        try:
            backend("no_such_scorer").close()
            outcome = "it booted"
        except ScorerStartupError as exc:
            outcome = (
                f"ScorerStartupError in {time.monotonic() - started:.2f} s, exit code "
                f"{exc.boot_code} reported on the pipe, status "
                f"{exc.record.exit_status if exc.record else '?'}"
            )
        served = backend("constant")
        rewards = served.compute_rewards(TEXT).rewards
        served.close()
    finally:
        process_module.open_child_log = opener
    return (
        f"unknown scorer with every log write failing (ENOSPC): {outcome}; a valid child "
        f"still served {rewards}"
    )


def sigchld_ignored() -> str:
    previous = signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    try:
        owner = backend("constant", restart={"backoff_s": 0})
        pid = pid_of(owner)
        os.kill(pid, signal.SIGKILL)
        gone(pid)
        try:
            owner.compute_rewards(TEXT)
            killed = "no error?"
        except ScorerError as exc:
            killed = exc.record.exit_status if exc.record else "?"
        owner.close()
        try:
            backend("no_such_scorer")
            boot = "booted?"
        except ScorerError as exc:
            boot = exc.record.exit_status if exc.record else "?"
    finally:
        signal.signal(signal.SIGCHLD, previous)
    return (
        f"kill -9 reported as {killed!r}; unknown scorer as {boot!r} (Popen alone says 'exit "
        f"0' for both)"
    )


def sustained_flood() -> str:
    owner = backend(
        "constant", process={"request_timeout": 3}, limits={"max_pending_connections": 8}
    )
    try:
        churn = [
            TRAINER,
            "-m",
            "tests.helpers.flood_connections",
            "churn",
            str(port_of(owner)),
            "15",
        ]
        floods = [subprocess.Popen(churn, cwd=ROOT) for _ in range(2)]
        served, unavailable, waits = 0, 0, []
        try:
            for _ in range(10):
                client_of(owner).transport.http.drop_idle()  # type: ignore[attr-defined]
                started = time.monotonic()
                try:
                    owner.compute_rewards(TEXT)
                    served += 1
                except ScorerUnavailable:
                    unavailable += 1
                waits.append(time.monotonic() - started)
        finally:
            for flood in floods:
                flood.kill()
                flood.wait()
        return (
            f"two processes connecting and closing nonstop, 10 calls on fresh connections "
            f"(deadline 3 s, 8 pending allowed): {served} served, {unavailable} "
            f"ScorerUnavailable (nothing sent), median {sorted(waits)[len(waits) // 2]:.2f} "
            f"s; {owner.restarts} restarts, child alive: {not child_of(owner).exited()}"
        )
    finally:
        owner.close()


SCENARIOS = [
    ("fork of the trainer", fork_of_the_trainer),
    ("unauthenticated connection flood", connection_flood),
    ("sustained connect/close flood", sustained_flood),
    ("large request, then idle (Shmem)", large_request_then_idle),
    ("offload, then a crash", offload_then_crash),
    ("fork during launch", fork_during_launch),
    ("a thread forking during launches", forking_thread_during_launch),
    ("Ctrl-C mid-batch", ctrl_c),
    ("full log disk", full_log_disk),
    ("SIGCHLD ignored", sigchld_ignored),
]


SCENARIOS += hardening_calls.SCENARIOS
# issue 37: the serving surface (identity, several servers, jobs, bodies, streams, wedged terms, the
# Ray pool)
for _module in (
    hardening_identity,
    hardening_jobs,
    hardening_bodies,
    hardening_stream,
    hardening_terms,
    hardening_ray,
):
    SCENARIOS += _module.SCENARIOS


# the smoke test's sizes (tests/ops/test_bench_smoke.py): every step and check of a scenario, on
# less data; the rows of `make bench` keep the defaults
SMOKE: dict[str, dict[str, object]] = {
    "a thread forking during launches": {"launches": 3},
    "hostile tail, default chunking; tree memory (items 3, 9)": {
        "ordinary": 14,
        "timeout_s": 1,
        "hazards": 2,
        "generation_s": 0.0,
    },
    "OpenRLHF route: 101 error answers, ERROR lines (item 6)": {"bad": 20},
}


def main(argv: list[str] | None = None) -> None:
    """Every row, or those whose name holds one of the arguments."""
    wanted = sys.argv[1:] if argv is None else argv
    print("| scenario | measured |\n|---|---|")
    for name, scenario in SCENARIOS:
        if not wanted or any(word in name for word in wanted):
            print(f"| {name} | {scenario()} |", flush=True)


if __name__ == "__main__":
    main()
