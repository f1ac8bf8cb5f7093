"""A stand-in trainer that forks while its managed child serves, as DataLoader workers do.

The fork calls the backend (must raise BackendNotOwned naming the owner), closes it,
drops it to the garbage collector and leaves with sys.exit(0), so at-exit finalizers
run in the fork. The owner then scores again and prints one JSON line: what the fork
saw, and whether the owner's child survived untouched.
"""
from __future__ import annotations

import gc
import json
import os
import sys

from supervisor import ManagedScorerProcessBackend, RewardItem, RewardRequest
from supervisor.errors import BackendNotOwned

REQUEST = RewardRequest(items=[RewardItem(id="a", text="abc")])


def in_the_fork(backend: ManagedScorerProcessBackend, report: int) -> None:
    try:
        backend.compute_rewards(REQUEST)
        seen = "scored"
    except BackendNotOwned as exc:
        seen = str(exc)
    backend.close()
    del backend
    gc.collect()
    os.write(report, seen.encode())
    sys.exit(0)


def main() -> None:
    backend = ManagedScorerProcessBackend({
        "process": {"python_executable": sys.argv[1], "startup_timeout": 60, "request_timeout": 60},
        "scorer": {"name": "nonempty"},
    })
    first = backend.compute_rewards(REQUEST).rewards
    pid = backend.pid
    read_end, write_end = os.pipe()
    fork = os.fork()
    if fork == 0:
        os.close(read_end)
        in_the_fork(backend, write_end)
    os.close(write_end)
    _, status = os.waitpid(fork, 0)
    seen = os.read(read_end, 65536).decode()
    after = backend.compute_rewards(REQUEST).rewards
    print(json.dumps({"owner": os.getpid(), "fork_status": status, "fork_saw": seen, "first": first,
                      "after": after, "pid_before": pid, "pid_after": backend.pid, "restarts": backend.restarts}))
    backend.close()


if __name__ == "__main__":
    main()
