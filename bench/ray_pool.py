"""The Ray reward pool vs managed children in the trainer, for the same batch, in one run.

`python -m bench.ray_pool` (what `make bench` runs, from the trainer venv) starts the Ray side in
envs/ray's python: a local Ray (`ray.init(num_cpus=2, resources={"reward_node": 2})`: one raylet,
since a two-raylet cluster is too heavy for `make bench` on 2 cores; the test builds one) with a
`RayPoolBackend` of 2 actors on `reward_node`, each owning a managed mean_intensity child
(envs/image), and, in the driver itself, a `ReplicatedBackend` of 2 managed children of the same
scorer. Both score the same 32 random 256x256x3 uint8 images in groups of 4 (6.3 MB), p50 of
interleaved rounds; rewards asserted equal. Both have 2 children: the difference is the pool's hop
(object store, actor call).

    envs/ray/.venv/bin/python -m bench.ray_pool ray DIR   # the Ray side; prints one JSON line
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np

from bench.common import interleaved, run_ray_side
from supervisor import RewardItem, RewardRequest

ROOT = Path(__file__).resolve().parent.parent
RAY_PYTHON = ROOT / "envs" / "ray" / ".venv" / "bin" / "python"
ROUNDS = 15
TIMEOUT_S = 300


def grpo_images(groups: int = 8, group: int = 4, side: int = 256) -> RewardRequest:
    rng = np.random.default_rng(7)
    items = [
        RewardItem(
            id=f"i{n}",
            group_id=f"g{n // group}",
            image=rng.integers(0, 256, (side, side, 3), dtype=np.uint8),
        )
        for n in range(groups * group)
    ]
    return RewardRequest(items=items, group_size=group)


def ray_side(temp_dir: str, rounds: int = ROUNDS, groups: int = 8) -> dict:
    """Both backends in one Ray driver, measured interleaved; Ray always shut down."""
    import ray

    from supervisor.compose.ray_pool import RayPoolBackend
    from supervisor.compose.replicas import ReplicatedBackend

    spec = {
        "env": "image",
        "scorer": {"name": "mean_intensity", "input_kind": "image"},
        "client": {"group_size": 4, "input_kind": "image"},
    }
    request = grpo_images(groups)
    ray.init(
        num_cpus=2,
        resources={"reward_node": 2},
        include_dashboard=False,
        log_to_driver=False,
        _temp_dir=temp_dir,
        object_store_memory=256 * 1024 * 1024,
    )
    try:
        started = time.perf_counter()
        pool = RayPoolBackend.create(
            {
                "name": "bench",
                "actors": 2,
                "num_cpus": 1,
                "resources": {"reward_node": 1},
                "scorer": spec,
            }
        )
        pool_start_s = time.perf_counter() - started
        with ReplicatedBackend({**spec, "replicas": {"count": 2}}) as children:
            try:
                expected = children.compute_rewards(request).rewards
                assert pool.compute_rewards(request).rewards == expected, (
                    "pool and children rewards differ"
                )
                times = interleaved(
                    {
                        "pool": lambda: pool.compute_rewards(request),
                        "children": lambda: children.compute_rewards(request),
                    },
                    rounds,
                    warmup=3,
                )
            finally:
                pool.close()
        return {"times": times, "pool_start_s": pool_start_s, "items": len(request.items)}
    finally:
        ray.shutdown()


def main_line(rounds: int = ROUNDS, groups: int = 8) -> str:
    label = "Ray pool vs managed children in the trainer"
    unavailable = ROOT / "envs" / "ray" / "UNAVAILABLE"
    if unavailable.exists() or not RAY_PYTHON.exists():
        return f"{label}: SKIPPED (envs/ray is not built here: `make env-ray`)"
    found, _ = run_ray_side(
        RAY_PYTHON,
        "bench.ray_pool",
        "the Ray pool bench",
        TIMEOUT_S,
        json.dumps({"rounds": rounds, "groups": groups}),
    )
    pool, children = found["times"]["pool"], found["times"]["children"]
    return (
        f"{found['items']}x256x256x3 mean_intensity, groups of 4  {label} (2 each, local "
        f"Ray, one raylet): pool p50 {pool * 1e3:7.2f} ms  children p50 "
        f"{children * 1e3:7.2f} ms  ratio {pool / children:5.2f}  "
        f"(+{(pool - children) * 1e3:.2f} ms; pool start {found['pool_start_s']:.1f} s)"
    )


if __name__ == "__main__":
    if sys.argv[1:2] == ["ray"]:
        print(json.dumps(ray_side(sys.argv[2], **json.loads(sys.argv[3]))))
    else:
        print(main_line())
