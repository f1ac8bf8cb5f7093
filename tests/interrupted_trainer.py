"""A stand-in trainer interrupted by Ctrl-C while its managed child scores a slow batch.

Prints one JSON line with the child's pid once the batch is in flight, then waits
for SIGINT inside compute_rewards under `with backend:`, as a training loop would.
"""

from __future__ import annotations

import json
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


def panel_main() -> None:
    """Two managed terms, scored concurrently by a panel, both busy when Ctrl-C comes."""
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
    with build_panel(PanelConfig.model_validate({"terms": terms})) as panel:

        def announce() -> None:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and not all(b.health()["in_flight"] for b in panel.backends):
                time.sleep(0.01)
            print(json.dumps({"children": [b.pid for b in panel.backends]}), flush=True)

        threading.Thread(target=announce, daemon=True).start()
        panel.compute_rewards(RewardRequest(items=[RewardItem(id="a", text="abc")]))


def main() -> None:
    if sys.argv[2:] == ["--panel"]:
        panel_main()
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
