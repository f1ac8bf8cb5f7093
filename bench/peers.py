"""`make bench-peers`: the image batch through a Ray actor and a Ray Serve deployment, next to ours.

Issue 5 asks how the managed child compares with the usual way of putting a scorer in
another process: a Ray actor (object store + gRPC) and a Ray Serve deployment (HTTP through
the Serve proxy). Both are measured in the same run as our in-process, shared-memory and
in-band paths, on the same 8 random 512x512x3 uint8 images, so the ratios survive a noisy
shared machine. Rewards are the mean pixel / 255 and must be equal everywhere (asserted):
scoring costs ~nothing, so the figures are the transport.

Ray is not a dependency of this project: it is installed into a scratch venv
(bench/.peers-venv, rebuilt when REQUIREMENTS change, like the scorer envs). If pip cannot
install it, the target prints one SKIPPED line and exits 0: it is optional.

    .venv/bin/python -m bench.peers                    # trainer side (this is what make runs)
    bench/.peers-venv/bin/python -m bench.peers ray DIR  # the Ray side; prints one JSON line

Module-level imports are stdlib + numpy only (and `bench.common`, stdlib only), since both venvs
import this file.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np

from bench.common import PEERS_VENV, ROOT, interleaved, run_ray_side

VENV = PEERS_VENV
VENV_PYTHON = VENV / "bin" / "python"
REQUIREMENTS = "ray[serve]==2.60.0\nnumpy==2.4.6\n"
INSTALL_TIMEOUT_S = 900
PEER_TIMEOUT_S = 300
BATCH_ROUNDS = 30
EMPTY_ROUNDS = 200


def rewards_of(images: list[np.ndarray]) -> list[float]:
    """Exactly what scorers.builtin.rules.MeanIntensity computes, so equality can be asserted."""
    return [float(a.mean(dtype=np.float64)) / 255.0 for a in images]


# --- Ray side (runs in bench/.peers-venv) ----------------------------------------------


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def ray_peer(temp_dir: str) -> dict:
    """Start a 2-CPU local Ray, measure actor and Serve calls, and always shut both down."""
    import http.client

    import ray
    from ray import serve

    from bench.workloads import image_items

    images = [item["image"] for item in image_items()]
    expected = rewards_of(images)
    body = b"".join(a.tobytes() for a in images)
    shape = images[0].shape

    @ray.remote(num_cpus=0)
    class Scorer:
        def empty(self) -> list:
            return []

        def score(self, batch: list[np.ndarray]) -> list[float]:
            return rewards_of(batch)

    @serve.deployment(ray_actor_options={"num_cpus": 0})
    class HttpScorer:
        async def __call__(self, request) -> list[float]:
            raw = await request.body()
            return rewards_of(list(np.frombuffer(raw, np.uint8).reshape(-1, *shape))) if raw else []

    started = time.perf_counter()
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        _temp_dir=temp_dir,
        object_store_memory=256 * 1024 * 1024,
    )
    try:
        actor = Scorer.remote()  # type: ignore[attr-defined]  # added by @ray.remote
        assert ray.get(actor.score.remote(images), timeout=60) == expected, (
            "Ray actor rewards differ"
        )
        port = _free_port()
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        serve.run(HttpScorer.bind(), route_prefix="/")  # type: ignore[attr-defined]  # added by @serve.deployment
        startup_s = time.perf_counter() - started
        # keep-alive, like our httpx client
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)

        def post(payload: bytes) -> list[float]:
            conn.request(
                "POST", "/", body=payload, headers={"content-type": "application/octet-stream"}
            )
            response = conn.getresponse()
            data = response.read()
            assert response.status == 200, (response.status, data[:200])
            return json.loads(data)

        assert post(body) == expected, "Ray Serve rewards differ"
        assert post(b"") == []
        empty = interleaved(
            {
                "actor": lambda: ray.get(actor.empty.remote(), timeout=60),
                "serve": lambda: post(b""),
            },
            EMPTY_ROUNDS,
            warmup=20,
        )
        batch = interleaved(
            {
                "actor": lambda: ray.get(actor.score.remote(images), timeout=60),
                "serve": lambda: post(body),
            },
            BATCH_ROUNDS,
            warmup=3,
        )
        conn.close()
        return {
            "ray": ray.__version__,
            "startup_s": startup_s,
            "rewards": expected,
            "actor_empty_p50_s": empty["actor"],
            "serve_empty_p50_s": empty["serve"],
            "actor_batch_p50_s": batch["actor"],
            "serve_batch_p50_s": batch["serve"],
        }
    finally:
        try:
            serve.shutdown()
        finally:
            ray.shutdown()


# --- trainer side (runs in .venv) -------------------------------------------------------


def build_venv() -> str | None:
    """Build the scratch venv when missing or stale; return a skip reason, or None when it is
    ready."""
    want = hashlib.sha256(REQUIREMENTS.encode()).hexdigest()
    stamp = VENV / ".requirements.sha256"
    if VENV_PYTHON.exists() and stamp.exists() and stamp.read_text().strip() == want:
        return None
    print(
        f"bench-peers: building {VENV.relative_to(ROOT)} "
        f"({REQUIREMENTS.strip().replace(chr(10), ', ')})",
        flush=True,
    )
    shutil.rmtree(VENV, ignore_errors=True)
    steps = [
        [sys.executable, "-m", "venv", str(VENV)],
        [str(VENV_PYTHON), "-m", "pip", "install", "-q", "--no-input", *REQUIREMENTS.split()],
        [str(VENV_PYTHON), "-m", "pip", "check"],
    ]
    for step in steps:
        try:
            done = subprocess.run(step, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            shutil.rmtree(VENV, ignore_errors=True)
            return f"`{' '.join(step[-3:])}` took over {INSTALL_TIMEOUT_S} s"
        if done.returncode:
            shutil.rmtree(VENV, ignore_errors=True)
            lines = [
                ln
                for ln in (done.stderr + done.stdout).splitlines()
                if ln.strip() and not ln.startswith("WARNING: Location")
            ]
            return (
                f"pip could not install {REQUIREMENTS.split()[0]}: "
                f"{lines[-1] if lines else done.returncode}"
            )
    stamp.write_text(want + "\n")
    return None


def ray_named_alive() -> int:
    """Processes named like Ray's anywhere on the machine (the `ps` check: nothing else here runs
    Ray)."""
    import psutil

    return sum(
        1
        for proc in psutil.process_iter(["name"])
        if proc.info["name"] in ("raylet", "gcs_server") or proc.info["name"].startswith("ray::")
    )


def run_peer() -> tuple[dict, int]:
    """Run ray_peer in the scratch venv under a deadline, then reap; return (figures, processes
    killed)."""
    return run_ray_side(VENV_PYTHON, "bench.peers", "the Ray peer", PEER_TIMEOUT_S)


def measure_ours() -> dict:
    """Our side on the same batch: in-process, managed child over shared memory and in-band; tiny
    request."""
    from bench.common import managed, p50, time_backends, timed, transport_trio
    from bench.handles import managed_of
    from bench.workloads import image_request
    from supervisor import RewardItem, RewardRequest

    request = image_request()
    tiny = RewardRequest(items=[RewardItem(id="a", text="x")])
    with transport_trio(request) as trio:
        rewards = trio["in-process"].compute_rewards(request).rewards
        times = time_backends(trio, request, rounds=BATCH_ROUNDS)
        spawn_s = managed_of(trio["shared"]).timings["spawn_to_ready_s"]
    with managed("image", "constant", "text", {}) as backend:
        times["tiny"] = p50(timed(lambda: backend.compute_rewards(tiny), EMPTY_ROUNDS, warmup=20))
    return {"times": times, "rewards": rewards, "spawn_s": spawn_s}


def report(ours: dict, ray: dict) -> list[str]:
    t, shared, tiny = ours["times"], ours["times"]["shared"], ours["times"]["tiny"]

    def line(label: str, value: float, base: float, base_name: str) -> str:
        return (
            f"{label:<38} p50 {value * 1e3:7.3f} ms = {value / base:5.2f} x {base_name} "
            f"({(value - base) * 1e3:+7.3f} ms)"
        )

    return [
        "8x512x512x3 uint8 (6.3 MB), mean_intensity; baseline: our managed child over shared "
        "memory",
        line("  in-process (LocalRewardBackend)", t["in-process"], shared, "managed shared"),
        line("  managed child, shared memory", shared, shared, "managed shared"),
        line("  managed child, in-band (HTTP body)", t["in-band"], shared, "managed shared"),
        line("  Ray actor, batch", ray["actor_batch_p50_s"], shared, "managed shared"),
        line(
            "  Ray Serve HTTP, batch as raw bytes",
            ray["serve_batch_p50_s"],
            shared,
            "managed shared",
        ),
        "tiny request; baseline: our managed child, 1 text item, scorer constant",
        line("  managed child, tiny", tiny, tiny, "managed tiny"),
        line("  Ray actor, empty call", ray["actor_empty_p50_s"], tiny, "managed tiny"),
        line("  Ray Serve HTTP, empty POST", ray["serve_empty_p50_s"], tiny, "managed tiny"),
        f"start: Ray init + actor + Serve deployment {ray['startup_s']:.2f} s; "
        f"managed child spawn->ready {ours['spawn_s']:.3f} s",
    ]


def main() -> int:
    reason = build_venv()
    if reason:
        print(f"bench-peers: SKIPPED - {reason}")
        return 0
    ours = measure_ours()
    ray, killed = run_peer()
    assert ray["rewards"] == ours["rewards"], "Ray and managed rewards differ"
    print(
        f"managed-scorers bench-peers  python {sys.version.split()[0]}  ray {ray['ray']}  "
        f"cores {len(os.sched_getaffinity(0))}"
    )
    print("\n".join(report(ours, ray)))
    print(
        f"Ray processes: {killed} outlived ray.shutdown() by 5 s (SIGKILLed); "
        f"named raylet/gcs_server/ray::* now: {ray_named_alive()}"
    )
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["ray"] and len(sys.argv) == 3:
        print(json.dumps(ray_peer(sys.argv[2])), flush=True)
    elif len(sys.argv) == 1:
        sys.exit(main())
    else:
        sys.exit("usage: python -m bench.peers [ray TEMP_DIR]")
