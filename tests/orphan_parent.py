"""A stand-in trainer: owns one managed child, reports its process group, then blocks.

Run as a subprocess by the orphan tests, which kill -9 it and look for survivors.
"""

from __future__ import annotations

import json
import sys
import time

from supervisor import ManagedScorerProcessBackend, RewardItem, RewardRequest
from tests.conftest import REPO_ROOT, group_members


def main() -> None:
    python, scorer, params, mode = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), sys.argv[4]
    backend = ManagedScorerProcessBackend(
        {
            "process": {
                "python_executable": python,
                "startup_timeout": 60,
                "request_timeout": 600,
                "extra_import_paths": [str(REPO_ROOT)],
            },
            "scorer": {"name": scorer, "params": params},
        }
    )
    time.sleep(0.2)  # let a forkserver's helpers settle into the group before counting
    print(json.dumps({"child": backend.pid, "group": group_members(backend.pid)}), flush=True)
    if mode == "scoring":
        items = [RewardItem(id=f"q{i}", text="\\boxed{9^{9^{9^{9}}}}", reference="1") for i in range(8)]
        backend.compute_rewards(RewardRequest(items=items))
    time.sleep(600)


if __name__ == "__main__":
    main()
