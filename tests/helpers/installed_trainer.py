"""Run from an installed managed-scorers (not the checkout): score `\\boxed{10\\%}` vs 0.1 in a math
child.

Prints one JSON line: the reward, the child's sys.path and packages, and where `supervisor` came
from.
"""

from __future__ import annotations

import json
import sys

import supervisor
from supervisor import ManagedScorerProcessBackend, RewardItem, RewardRequest


def main() -> None:
    spec = {
        "process": {"python_executable": sys.argv[1]},
        "scorer": {"name": "math_verify", "params": {"jobs": 1}},
    }
    with ManagedScorerProcessBackend(spec) as backend:
        request = RewardRequest(
            items=[RewardItem(id="a", text="so \\boxed{10\\%}", reference="0.1")]
        )
        reward = backend.compute_rewards(request).rewards[0]
        health = backend.health()
    print(
        json.dumps(
            {
                "reward": reward,
                "sys_path": health["sys_path"],
                "packages": health["packages"],
                "supervisor": supervisor.__file__,
            }
        )
    )


if __name__ == "__main__":
    main()
