"""A stand-in trainer interrupted by Ctrl-C while its managed child scores a slow batch.

Prints one JSON line with the child's pid once the batch is in flight, then waits
for SIGINT inside compute_rewards under `with backend:`, as a training loop would.
"""

from __future__ import annotations

import json
import signal
import sys
import threading
import time

from supervisor import ManagedScorerProcessBackend, PanelConfig, RewardItem, RewardRequest, build_panel
from tests.conftest import REPO_ROOT


def announce_when_in_flight(backend: ManagedScorerProcessBackend) -> None:
    deadline = time.monotonic() + 30
    while backend.health()["in_flight"] == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    print(json.dumps({"child": backend.pid}), flush=True)


def panel_main(local: bool) -> None:
    """Two terms, scored concurrently by a panel, both busy when Ctrl-C comes: two managed children,
    or (`local`) one child and one in-process scorer, which nothing can stop early."""
    terms = [
        {
            "name": f"slow{n}",
            "backend": {
                "process": {
                    "python_executable": sys.argv[1],
                    "request_timeout": 120,
                    "shutdown_timeout": 10,
                    "extra_import_paths": [str(REPO_ROOT)],
                },
                "scorer": {"name": "tests.fixture_scorers:Probe", "params": {"sleep_s": 60 + n}},
            },
        }
        for n in range(2)
    ]
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
        panel.compute_rewards(RewardRequest(items=[RewardItem(id="a", text="abc")]))


def main() -> None:
    # A trainer at a terminal has Python's Ctrl-C handler even when whoever started this test
    # ignored SIGINT (a background job of a non-interactive shell does, and children inherit it).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if sys.argv[2:] in (["--panel"], ["--panel-local"]):
        panel_main(local=sys.argv[2] == "--panel-local")
        return
    with ManagedScorerProcessBackend(
        {
            "process": {
                "python_executable": sys.argv[1],
                "request_timeout": 120,
                "shutdown_timeout": 10,
                "extra_import_paths": [str(REPO_ROOT)],
            },
            "scorer": {"name": "tests.fixture_scorers:Probe", "params": {"sleep_s": 60}},
        }
    ) as backend:
        threading.Thread(target=announce_when_in_flight, args=(backend,), daemon=True).start()
        backend.compute_rewards(RewardRequest(items=[RewardItem(id="a", text="abc")]))


if __name__ == "__main__":
    main()
