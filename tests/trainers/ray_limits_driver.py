"""A Ray driver for tests/trainers/test_ray_pool.py's shared endpoint limit across two raylets,
run by envs/ray's python with the checkout first on PYTHONPATH:

    python ray_limits_driver.py ADDRESS BASE_URL MODE LIMITS_ROOT OUT

Eight ranks (Ray tasks, four on each raylet), each a judge with `endpoint_limit` {600/min, 3 in
flight} against BASE_URL, each node with its own limits directory (two machines share no files).
MODE `local`: each node's own limit, as before the coordinator; `coordinated`: the coordinator
actor (`coordinate_on_ray`, on the head) holds it for both. Every rank is loaded, then all start
at once (a gate actor); the ranks' rewards, errors and nodes go to OUT as JSON.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import ray

from scorers.limits.rundir import DIR_ENV
from supervisor.limits.ray_host import coordinate_on_ray
from tests.helpers.limited_openai import JUDGE as LIMITED_JUDGE

RANKS_PER_NODE = 4
ITEMS = 4
JUDGE = {**LIMITED_JUDGE, "endpoint_limit": {"requests_per_minute": 600, "concurrency": 3}}


@ray.remote(num_cpus=0)
class Gate:
    def __init__(self, expected: int) -> None:
        self.expected, self.arrived = expected, 0

    def arrive(self) -> None:
        self.arrived += 1

    def open(self) -> bool:
        return self.arrived >= self.expected


@ray.remote(num_cpus=0)
def rank(base_url: str, gate: Any) -> dict[str, Any]:
    from scorers.base import ScoreItem
    from scorers.builtin.llm_judge import LlmJudge

    judge = LlmJudge(**JUDGE, base_url=base_url)
    judge.load()
    try:
        ray.get(gate.arrive.remote())
        while not ray.get(gate.open.remote()):
            time.sleep(0.01)
        result = judge.score([ScoreItem(id=f"i{n}", text=f"answer {n}") for n in range(ITEMS)])
    finally:
        judge.close()
    rewards = [None if v != v else v for v in result.terms["llm_judge"]]
    node = ray.get_runtime_context().get_node_id()
    return {"rewards": rewards, "errors": result.failed, "node": node}


def main() -> int:
    address, base_url, mode, root, out = sys.argv[1:6]
    ray.init(address=address, namespace="managed-scorers", log_to_driver=False)
    try:
        coordinated = coordinate_on_ray(resources={"head": 0.01}) if mode == "coordinated" else {}
        gate = Gate.remote(2 * RANKS_PER_NODE)
        ranks = []
        for node, share in (("head", 0.2), ("reward_node", 0.4)):
            env = {DIR_ENV: str(Path(root) / node), **coordinated}
            placed = rank.options(resources={node: share}, runtime_env={"env_vars": env})
            ranks += [placed.remote(base_url, gate) for _ in range(RANKS_PER_NODE)]
        results = ray.get(ranks, timeout=120)
        Path(out).write_text(json.dumps({"ranks": results, "coordinator": coordinated}))
    finally:
        ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
