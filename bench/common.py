"""What the bench lines share, in one module: the envs' pythons and their drivers, timing in
alternation, a managed backend and the transport trio, `serve` processes, the math workload, a
process tree's peak memory, and a Ray side run and reaped.

Every line imports its helpers from here (and the inputs from `bench.workloads`, the fake peers, the
typed `bench.handles`), never `bench.__main__` or another line, so the bench has no import cycle.
Module-level imports are the stdlib only: drivers import it in scorer envs and in the Ray venv (no
numpy, no `supervisor` there); what needs more imports it inside.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from supervisor import ManagedScorerProcessBackend, RewardBackend, RewardRequest

B = TypeVar("B", bound="RewardBackend")
T = TypeVar("T")
U = TypeVar("U")
ROOT = Path(__file__).resolve().parent.parent
MATH_PYTHON = ROOT / "envs" / "math" / ".venv" / "bin" / "python"
PEERS_VENV = ROOT / "bench" / ".peers-venv"  # the Ray peers' scratch venv (bench.peers builds it)
# in the Ray side's environment, so every Ray process can be found
MARKER = "MANAGED_SCORERS_BENCH_PEERS"


# -- the envs' pythons and their drivers -----------------------------------------------------------


def env_python(name: str) -> str:
    return str(ROOT / "envs" / name / ".venv" / "bin" / "python")


def run_driver(env: str, module: str, *args: str, timeout_s: float = 900) -> dict:
    """A bench driver module run by env's python from the checkout; its JSON report (last stdout
    line)."""
    done = subprocess.run(
        [env_python(env), "-m", module, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    if done.returncode != 0:
        raise RuntimeError(
            f"{module} failed in envs/{env} (exit {done.returncode}):\n{done.stderr[-3000:]}"
        )
    return json.loads(done.stdout.strip().splitlines()[-1])


def in_math_env(module: str, measure: Callable[..., str], **sizes: Any) -> str:
    """`measure(**sizes)` here when this is the math env's python (antlr 4.13.2), else
    `python -m module SIZES_JSON` run there (its `sizes_of_argv()`); its last line."""
    if Path(sys.prefix).resolve() == MATH_PYTHON.parent.parent.resolve():
        return measure(**sizes)
    done = subprocess.run(
        [str(MATH_PYTHON), "-m", module, json.dumps(sizes)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        # a backstop against a hang, as run_driver's: hostile_math's full run takes 300 s loaded
        timeout=900,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    if done.returncode != 0:
        raise RuntimeError(f"{module} failed ({done.returncode}): {done.stderr[-2000:]}")
    return done.stdout.strip().splitlines()[-1]


def sizes_of_argv() -> dict[str, Any]:
    """The sizes `in_math_env` passed (a JSON object as the first argument), or none: the
    defaults."""
    return json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}


# -- timing ----------------------------------------------------------------------------------------


def timed(fn: Callable[[], object], repeats: int, warmup: int = 3) -> list[float]:
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - started)
    return samples


def interleaved(
    fns: dict[str, Callable[[], object]], rounds: int, warmup: int = 2
) -> dict[str, float]:
    """p50 of each fn, measured in alternation so machine drift hits all of them alike."""
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for fn in fns.values():
        timed(fn, 0, warmup)
    for _ in range(rounds):
        for name, fn in fns.items():
            samples[name] += timed(fn, 1, warmup=0)
    return {name: p50(values) for name, values in samples.items()}


def p50(samples: list[float]) -> float:
    return statistics.median(samples)


# -- managed backends ------------------------------------------------------------------------------


def managed(
    env: str, scorer: str, kind: str, params: dict, **client: object
) -> ManagedScorerProcessBackend:
    from supervisor import ManagedScorerProcessBackend

    return ManagedScorerProcessBackend(
        {
            "process": {"python_executable": env_python(env)},
            "scorer": {"name": scorer, "input_kind": kind, "params": params},
            "client": {"input_kind": kind, "request_batch_size": 64, **client},
        }
    )


def both(first: Callable[[], T], second: Callable[[], U], together: bool) -> tuple[T, U]:
    """Both calls' results: one after the other, or, `together` (a smoke run's independent steps),
    at once in two threads, each bounding itself; the first failure raised once both have ended."""
    if not together:
        return first(), second()
    from supervisor.fanout import on_each

    outcomes = on_each([first, second], lambda call: call(), "bench-together")
    for outcome in outcomes:
        if isinstance(outcome, BaseException):
            raise outcome
    return outcomes[0], outcomes[1]  # type: ignore[return-value]  # none raised


def start_all(builds: Sequence[Callable[[], B]], together: bool) -> list[B]:
    """Each backend built (and started): one after the other, so a start measured is alone on the
    machine, or, `together` (a smoke run's independent starts), all at once through
    `compose.build.build_all`, which closes every one made if any fails or Ctrl-C arrives."""
    if not together:
        made: list[B] = []
        try:
            for build in builds:
                made.append(build())
        except BaseException:
            for backend in made:
                backend.close()
            raise
        return made
    from supervisor.compose.build import build_all

    return build_all(builds)  # type: ignore[return-value]  # each as its build made it


@contextlib.contextmanager
def transport_trio(request: RewardRequest) -> Iterator[dict[str, RewardBackend]]:
    """`mean_intensity` in-process, managed over shared memory and managed in-band; equal rewards
    asserted."""
    from supervisor import LocalRewardBackend

    with (
        managed("image", "mean_intensity", "image", {}) as shared,
        managed("image", "mean_intensity", "image", {}, shared_memory_min_bytes=None) as in_band,
        LocalRewardBackend("mean_intensity") as local,
    ):
        expected = local.compute_rewards(request).rewards
        assert (
            shared.compute_rewards(request).rewards
            == expected
            == in_band.compute_rewards(request).rewards
        )
        assert shared.ready_info["shared_memory"] and not in_band.ready_info["shared_memory"]
        yield {"in-process": local, "shared": shared, "in-band": in_band}


def scoring(backend: RewardBackend, request: RewardRequest) -> Callable[[], object]:
    return lambda: backend.compute_rewards(request)


def time_backends(
    backends: dict[str, RewardBackend], request: RewardRequest, rounds: int
) -> dict[str, float]:
    return interleaved(
        {name: scoring(backend, request) for name, backend in backends.items()}, rounds=rounds
    )


# -- `managed-scorers serve` processes -------------------------------------------------------------


def readiness(
    ready: Path, server: subprocess.Popen[Any], deadline_s: float = 120.0
) -> dict[str, Any]:
    """The first line `serve` wrote to `ready` (its stdout). A server that exits first, or writes
    nothing by the deadline, raises; stopping it is the caller's (`stop`, in its finally)."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        text = ready.read_text()
        if text.endswith("\n"):
            return dict(json.loads(text.splitlines()[0]))
        if server.poll() is not None:
            raise RuntimeError(
                f"serve (pid {server.pid}) exited with {server.returncode} before it was ready"
            )
        time.sleep(0.02)
    raise TimeoutError(
        f"no readiness line in {ready} from serve (pid {server.pid}) after {deadline_s} s"
    )


def stop(*servers: subprocess.Popen[Any], grace_s: float = 15.0) -> None:
    """SIGTERM to each (SIGCONT first: a stopped server cannot act on it), then SIGKILL past
    `grace_s`."""
    for server in servers:
        if server.poll() is None:
            server.send_signal(signal.SIGCONT)
            server.send_signal(signal.SIGTERM)
    for server in servers:
        try:
            server.wait(grace_s)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(5)


def judged_request(n: int, group: int, wait_s: float) -> RewardRequest:
    """`n` items in groups of `group` for the fake OpenAI judge, each answered after `wait_s`."""
    from supervisor import RewardItem, RewardRequest

    items = [
        RewardItem(
            id=f"j{i}",
            group_id=f"q{i // group}",
            prompt=f"question {i // group}",
            text=f"[[slow:{wait_s}]] {i}",
        )
        for i in range(n)
    ]
    return RewardRequest(items=items, group_size=group)


@contextlib.contextmanager
def judge_servers(
    count: int, base_url: str, token: str
) -> Iterator[list[tuple[subprocess.Popen[Any], str]]]:
    """`count` serve processes of the LLM judge (concurrency 4) asking the OpenAI endpoint at
    `base_url`, started together; each one's process and URL once every one is ready."""
    params = {"base_url": base_url, "model": "fake-judge", "concurrency": 4}
    command = [sys.executable, "-m", "supervisor", "serve", "--scorer", "llm_judge"]
    command += [
        "--python",
        sys.executable,
        "--params",
        json.dumps(params | {"request_timeout_s": 10.0}),
    ]
    with tempfile.TemporaryDirectory(prefix="bench-servers-") as folder:
        processes, lines = [], [Path(folder) / f"{n}.json" for n in range(count)]
        try:
            for line in lines:
                with open(line, "w") as out:
                    env = {**os.environ, "MANAGED_SCORERS_TOKEN": token}
                    processes.append(
                        subprocess.Popen(command, stdout=out, stderr=subprocess.DEVNULL, env=env)
                    )
            yield [
                (process, f"http://127.0.0.1:{readiness(line, process, 60)['port']}")
                for process, line in zip(processes, lines, strict=True)
            ]
        finally:
            stop(*processes)


# -- the math workload -----------------------------------------------------------------------------


def workload(start: int, n: int) -> list[tuple[str, str]]:
    """n distinct (completion, gold) pairs: fractions vs decimals, percents, integers,
    polynomials, radicals, and wrong answers -- all graded in milliseconds when warm."""
    pairs = []
    for i in range(start, start + n):
        a = i % 9 + 2
        kind = [
            (f"\\boxed{{\\frac{{1}}{{{i + 2}}}}}", repr(1 / (i + 2))),
            (f"\\boxed{{{i}\\%}}", repr(i / 100)),
            (f"\\boxed{{{7 * i + 3}}}", str(7 * i + 3)),
            (f"\\boxed{{(x+{i})^2}}", f"$x^2+{2 * i}x+{i * i}$"),
            (f"\\boxed{{\\sqrt{{{2 * i * i}}}}}", f"${i}\\sqrt{{2}}$"),
            (f"so $x = {i + 1}$", str(i)),  # wrong
            (f"\\boxed{{{i}/{i + 1}}}", f"$\\frac{{{i}}}{{{i + 1}}}$"),
            (f"\\boxed{{\\frac{{{i}}}{{2}} + \\frac{{1}}{{3}}}}", f"$\\frac{{{3 * i + 2}}}{{6}}$"),
            (f"\\boxed{{(x+{a})(x-{a})}}", f"$x^2+{a * a}$"),  # wrong
        ][i % 9]
        pairs.append(
            (f"Problem {i}: working through it step by step, the result is {kind[0]}.", kind[1])
        )
    return pairs


# -- a process tree's memory -----------------------------------------------------------------------


def tree_memory(pid: int) -> tuple[int, int]:
    """(PSS, RSS) summed over a process and its descendants: PSS shares each page among the
    processes that map it (forked workers share their preloaded heap), RSS counts it in each."""
    import psutil

    pss = rss = 0
    try:
        tree = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0, 0
    for process in tree:
        try:
            with open(f"/proc/{process.pid}/smaps_rollup") as rollup:
                for line in rollup:
                    if line.startswith(("Pss:", "Rss:")):
                        kib = int(line.split()[1]) << 10
                        pss, rss = (pss + kib, rss) if line.startswith("Pss:") else (pss, rss + kib)
        except (FileNotFoundError, ProcessLookupError):
            continue
    return pss, rss


class PeakMemory:
    """Samples a process tree's memory every 50 ms inside the block; `peak_pss` and `peak_rss` after
    it."""

    def __init__(self, pid: int) -> None:
        self.pid, self.peak_pss, self.peak_rss = pid, 0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(0.05):
            pss, rss = tree_memory(self.pid)
            self.peak_pss, self.peak_rss = max(self.peak_pss, pss), max(self.peak_rss, rss)

    def __enter__(self) -> PeakMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)


# -- a Ray side, run and reaped --------------------------------------------------------------------


def ray_processes(temp_dir: str) -> list:
    """This run's Ray processes. Workers and agents retitle themselves `ray::X`, so their command
    lines no longer name the venv: they are found by the MARKER or HOME (both temp_dir) they
    inherit. setproctitle zeroes the start of the environ block, so it is read raw (psutil's
    environ() is empty)."""
    import psutil

    wanted = {f"{MARKER}={temp_dir}".encode(), f"HOME={temp_dir}".encode()}
    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        try:
            marked = bool(wanted & set(Path(f"/proc/{proc.pid}/environ").read_bytes().split(b"\0")))
        except OSError:  # gone, or not ours to read
            marked = False
        text = " ".join(proc.info["cmdline"] or [])
        if proc.pid != os.getpid() and (marked or str(PEERS_VENV) in text or temp_dir in text):
            found.append(proc)
    return found


def reap(temp_dir: str, grace_s: float = 5.0) -> int:
    """Give this run's Ray processes grace_s to exit after ray.shutdown(), SIGKILL the rest; return
    how many."""
    import psutil

    _, alive = psutil.wait_procs(ray_processes(temp_dir), timeout=grace_s)
    for proc in alive:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=10)
    assert not ray_processes(temp_dir), "Ray processes survived SIGKILL"
    return len(alive)


def run_ray_side(
    python: Path, module: str, what: str, timeout_s: float, *extra: str
) -> tuple[dict, int]:
    """`python -m MODULE ray TEMP_DIR EXTRA...` (a driver that starts a local Ray) in its own
    session and scratch directory, under a deadline, then every Ray process it left reaped; its last
    JSON line and the number of processes killed. The temp dir is short (Ray's socket paths live
    under it) and is HOME too: Ray 2.60 writes its default auth token to ~/.ray/auth_token."""
    temp_dir = tempfile.mkdtemp(prefix="msray")
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "RAY_USAGE_STATS_ENABLED": "0",
        "HOME": temp_dir,
        MARKER: temp_dir,
    }
    env.pop("CUDA_VISIBLE_DEVICES", None)
    proc = subprocess.Popen(
        [str(python), "-m", module, "ray", temp_dir, *extra],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout_s)
    finally:
        if proc.poll() is None:  # past the deadline, or we were interrupted
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
        killed = reap(temp_dir)
        shutil.rmtree(temp_dir, ignore_errors=True)
    if proc.returncode:
        raise RuntimeError(f"{what} failed (rc={proc.returncode}):\n{err[-4000:]}")
    found: dict = json.loads([line for line in out.splitlines() if line.startswith("{")][-1])
    return found, killed
