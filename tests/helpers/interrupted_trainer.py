"""A stand-in trainer interrupted by Ctrl-C while its managed child scores a slow batch.

Prints one JSON line with the child's pid once the batch is in flight, then waits
for SIGINT inside compute_rewards under `with backend:`, as a training loop would
(`--via submit`: in `submit(...).result()`; `--via async`: in
`asyncio.run(compute_rewards_async(...))`; `--via stream`: at a stream's barrier, `results()`).
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import threading
import time

from supervisor import (
    ManagedScorerProcessBackend,
    PanelConfig,
    ReplicatedBackend,
    RewardItem,
    RewardRequest,
    build_panel,
)
from tests.conftest import REPO_ROOT


def announce_when_in_flight(backend: ManagedScorerProcessBackend) -> None:
    deadline = time.monotonic() + 30
    while backend.health()["in_flight"] == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    print(json.dumps({"child": backend.pid}), flush=True)


def call(backend, request: RewardRequest) -> None:
    """The request the way `--via` says a trainer sends it."""
    via = sys.argv[sys.argv.index("--via") + 1] if "--via" in sys.argv else "call"
    if via == "submit":
        backend.submit(request).result()
    elif via == "async":
        asyncio.run(backend.compute_rewards_async(request))
    elif via == "stream":  # items added as they finish, Ctrl-C at the step's barrier
        with backend.stream() as stream:
            stream.add(request.items)
            stream.results()
    else:
        backend.compute_rewards(request)


def process_spec(sleep_s: float) -> dict:
    return {
        "process": {
            "python_executable": sys.argv[1],
            "request_timeout": 120,
            "shutdown_timeout": 10,
            "extra_import_paths": [str(REPO_ROOT)],
        },
        "scorer": {"name": "tests.helpers.fixture_scorers:Probe", "params": {"sleep_s": sleep_s}},
    }


def replicas_main() -> None:
    """Two replicas, each busy with its half of the request when Ctrl-C comes."""
    with ReplicatedBackend({**process_spec(60), "replicas": {"count": 2}}) as backend:

        def announce() -> None:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and not all(
                r.health()["in_flight"] for r in backend.replicas
            ):
                time.sleep(0.01)
            print(json.dumps({"children": [r.pid for r in backend.replicas]}), flush=True)

        threading.Thread(target=announce, daemon=True).start()
        call(
            backend,
            RewardRequest(items=[RewardItem(id="a", text="abc"), RewardItem(id="b", text="abc")]),
        )


def panel_main(local: bool) -> None:
    """Two terms, scored concurrently by a panel, both busy when Ctrl-C comes: two managed children,
    or (`local`) one child and one in-process scorer, which nothing can stop early."""
    terms = [{"name": f"slow{n}", "backend": process_spec(60 + n)} for n in range(2)]
    if local:
        terms[1]["backend"] = {"kind": "local", "scorer": terms[1]["backend"]["scorer"]}
    with build_panel(PanelConfig.model_validate({"terms": terms})) as panel:
        managed = [b for b in panel.backends if isinstance(b, ManagedScorerProcessBackend)]

        def announce() -> None:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and not all(b.health()["in_flight"] for b in managed):
                time.sleep(0.01)
            time.sleep(0.2)  # the in-process term is well inside its 60 s sleep too
            print(json.dumps({"children": [b.pid for b in managed]}), flush=True)

        threading.Thread(target=announce, daemon=True).start()
        call(panel, RewardRequest(items=[RewardItem(id="a", text="abc")]))


def main() -> None:
    # A trainer at a terminal has Python's Ctrl-C handler even when whoever started this test
    # ignored SIGINT (a background job of a non-interactive shell does, and children inherit it).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if "--panel" in sys.argv or "--panel-local" in sys.argv:
        panel_main(local="--panel-local" in sys.argv)
        return
    if "--replicas" in sys.argv:
        replicas_main()
        return
    with ManagedScorerProcessBackend(process_spec(60)) as backend:
        threading.Thread(target=announce_when_in_flight, args=(backend,), daemon=True).start()
        call(backend, RewardRequest(items=[RewardItem(id="a", text="abc")]))


if __name__ == "__main__":
    main()
