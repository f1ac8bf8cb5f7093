"""Ray places the ranks, each rank owns its children: one actor per trainer rank, each with its
own managed math_verify child (envs/math), narrowed to the actor's GPU.

    envs/ray/.venv/bin/python examples/ray_actor.py --ranks 2
    envs/ray/.venv/bin/python examples/ray_actor.py --ranks 2 --logical-gpus 2 --kill-one --report
    out.json

The driver splits a batch over the actors and checks every reward against the answer key. With
`--logical-gpus N` Ray is told the node has N GPUs (on a CPU machine too): each actor asks for
one, and its child must see exactly that one. `--kill-one` ends one actor with `ray.kill` and
waits for its child (and the child's graders) to be gone: the child watches its parent, whoever
kills it. Compare with serving the scorer from Ray Serve: see the README ("Ray").
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil
import ray

from supervisor import ManagedScorerProcessBackend, RewardItem, RewardRequest

ROOT = Path(__file__).resolve().parent.parent


@ray.remote(num_cpus=0)
class RewardRank:
    """One trainer rank's reward side: the actor owns its managed child and closes it with
    itself."""

    def __init__(self, rank: int) -> None:
        # what a Ray trainer (verl) sets for its workers: the label on logs and metrics
        os.environ["RANK"] = str(rank)
        self.backend = ManagedScorerProcessBackend(
            {
                "env": "math",
                "scorer": {"name": "math_verify", "params": {"jobs": 1}},
                "process": {"request_timeout": 60},
            }
        )

    def child(self) -> dict[str, Any]:
        pid = self.backend.pid
        assert pid is not None
        process = psutil.Process(pid)
        return {
            "actor_pid": os.getpid(),
            "ray_gpus": [str(gpu) for gpu in ray.get_gpu_ids()],
            "pid": pid,
            "tree": [pid, *(p.pid for p in process.children(recursive=True))],
            "cuda_visible_devices": process.environ().get("CUDA_VISIBLE_DEVICES"),
            "log": Path(self.backend.log_path or "").name,
        }

    def score(self, items: list[dict[str, Any]]) -> list[float]:
        request = RewardRequest(items=[RewardItem(**item) for item in items])
        return self.backend.compute_rewards(request).rewards

    def close(self) -> None:
        self.backend.close()


def batch(size: int) -> tuple[list[dict[str, Any]], list[float]]:
    items, expected = [], []
    for n in range(size):
        a, b = n + 1, 2 * n + 3
        right = n % 3 != 0
        items.append(
            {
                "id": f"i{n}",
                "text": f"\\boxed{{{a + b if right else a - b}}}",
                "reference": str(a + b),
            }
        )
        expected.append(1.0 if right else 0.0)
    return items, expected


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def gone(pids: list[int], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not any(alive(pid) for pid in pids):
            return True
        time.sleep(0.05)
    return False


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--items", type=int, default=64)
    parser.add_argument(
        "--logical-gpus", type=int, default=None, help="tell Ray the node has this many GPUs"
    )
    parser.add_argument(
        "--kill-one", action="store_true", help="ray.kill one actor; its child must go with it"
    )
    parser.add_argument("--report", type=Path)
    args = parser.parse_args()
    temp_dir = tempfile.mkdtemp(prefix="msray")  # short: Ray puts its sockets under it
    ray.init(
        num_cpus=2,
        num_gpus=args.logical_gpus,
        include_dashboard=False,
        log_to_driver=False,
        _temp_dir=temp_dir,
        object_store_memory=128 * 1024 * 1024,
    )
    report: dict[str, Any] = {}
    try:
        gpus = 1 if args.logical_gpus else 0
        actors = [RewardRank.options(num_gpus=gpus).remote(rank) for rank in range(args.ranks)]  # type: ignore[attr-defined]
        report["children"] = ray.get([actor.child.remote() for actor in actors], timeout=120)
        items, expected = batch(args.items)
        shards = [items[rank :: args.ranks] for rank in range(args.ranks)]
        began = time.perf_counter()
        scored = ray.get(
            [actor.score.remote(shard) for actor, shard in zip(actors, shards, strict=True)],
            timeout=120,
        )
        report["score_ms"] = (time.perf_counter() - began) * 1000
        rewards = [0.0] * len(items)
        for rank, values in enumerate(scored):
            for offset, value in enumerate(values):
                rewards[rank + offset * args.ranks] = value
        report["rewards_match"] = rewards == expected
        if args.kill_one:
            victim = report["children"][0]
            began = time.monotonic()
            ray.kill(actors[0])
            report["killed_child_gone"] = gone(victim["tree"], 15.0)
            report["killed_child_gone_s"] = time.monotonic() - began
            actors = actors[1:]
        ray.get([actor.close.remote() for actor in actors], timeout=60)
    finally:
        ray.shutdown()
        if args.report is not None:
            args.report.write_text(json.dumps(report))
    print(json.dumps({k: v for k, v in report.items() if k != "children"}))
    return 0 if report.get("rewards_match") and report.get("killed_child_gone", True) else 1


if __name__ == "__main__":
    sys.exit(main())
