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
    # the group to wait for before reporting it
    members = int(sys.argv[5]) if len(sys.argv) > 5 else 1
    # a scorer whose spec is per instance (an engine model's) names its input kind
    kind = {"input_kind": sys.argv[6]} if len(sys.argv) > 6 else {}
    backend = ManagedScorerProcessBackend(
        {
            "process": {
                "python_executable": python,
                "startup_timeout": 60,
                "request_timeout": 600,
                "extra_import_paths": [str(REPO_ROOT)],
            },
            "scorer": {"name": scorer, "params": params, **kind},
        }
    )
    group = _group_of_at_least(backend.pid, members, deadline=time.monotonic() + 30)
    print(json.dumps({"child": backend.pid, "group": group}), flush=True)
    if mode == "scoring":
        items = [
            RewardItem(id=f"q{i}", text="\\boxed{9^{9^{9^{9}}}}", reference="1") for i in range(8)
        ]
        backend.compute_rewards(RewardRequest(items=items))
    time.sleep(600)


def _group_of_at_least(pgid: int, members: int, deadline: float) -> list[int]:
    """The child's process group once it holds `members` processes (a pool's forkserver, tracker and
    workers start as the scorer loads), or as it is at the deadline: the test says what is
    missing."""
    group = group_members(pgid)
    while len(group) < members and time.monotonic() < deadline:
        time.sleep(0.01)
        group = group_members(pgid)
    return group


if __name__ == "__main__":
    main()
