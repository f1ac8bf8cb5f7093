"""A stand-in trainer that forks while its managed child serves, as DataLoader workers do.

Two forks, one after the other. The first only drops the backend to the garbage collector
and leaves with sys.exit(0), so at-exit finalizers run in it. The second calls the backend
(it must raise BackendNotOwned naming the owner), closes it and leaves the same way. The
owner then scores again and prints one JSON line: what the forks saw, and whether its
child survived untouched.
"""

from __future__ import annotations

import gc
import json
import os
import sys

from supervisor import ManagedScorerProcessBackend, RewardItem, RewardRequest
from supervisor.errors import BackendNotOwned

REQUEST = RewardRequest(items=[RewardItem(id="a", text="abc")])


def in_the_fork(backend: ManagedScorerProcessBackend, report: int, call: bool) -> None:
    seen = "did not call"
    if call:
        try:
            backend.compute_rewards(REQUEST)
            seen = "scored"
        except BackendNotOwned as exc:
            seen = str(exc)
        try:  # the non-blocking form refuses at once too, not later on its future
            backend.submit(REQUEST)
            seen += " | submitted"
        except BackendNotOwned as exc:
            seen += " | submit: " + str(exc)
        backend.close()
    del backend
    gc.collect()
    os.write(report, seen.encode())
    sys.exit(0)


def fork_and_wait(backend: ManagedScorerProcessBackend, call: bool) -> tuple[int, str]:
    read_end, write_end = os.pipe()
    fork = os.fork()
    if fork == 0:
        os.close(read_end)
        in_the_fork(backend, write_end, call)
    os.close(write_end)
    _, status = os.waitpid(fork, 0)
    seen = os.read(read_end, 65536).decode()
    os.close(read_end)
    return status, seen


def main() -> None:
    backend = ManagedScorerProcessBackend(
        {
            "process": {
                "python_executable": sys.argv[1],
                "startup_timeout": 60,
                "request_timeout": 60,
            },
            "scorer": {"name": "nonempty"},
        }
    )
    first = backend.compute_rewards(REQUEST).rewards
    pid = backend.pid
    dropped = fork_and_wait(backend, call=False)
    called = fork_and_wait(backend, call=True)
    after = backend.compute_rewards(REQUEST).rewards
    report = {
        "owner": os.getpid(),
        "fork_status": [dropped[0], called[0]],
        "fork_saw": called[1],
        "first": first,
        "after": after,
        "pid_before": pid,
        "pid_after": backend.pid,
        "restarts": backend.restarts,
    }
    print(json.dumps(report))
    backend.close()


if __name__ == "__main__":
    main()
