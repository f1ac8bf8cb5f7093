"""A GRPO step's panel behind `managed-scorers serve --recipe` vs the same panel built in-process.

`python -m bench.panel_server`: 128 math completions in groups of 8 through a panel of three
managed terms (math_verify in envs/math, `jobs: 1`; exact_match and token_f1 in envs/image).
The server's panel and the in-process one each own their three children; the same request goes
to both, rounds interleaved, through `RemoteRewardBackend` and `RewardPanel.compute_rewards`;
the rewards are asserted equal. The overhead is measured with the batch sent as one exchange
(`request_batch_size` 128: the in-process panel's own call shape), so the difference is what
the server adds (one more loopback hop, its decode and encode); the default client (64-item
chunks, sent together: the panel server takes 4 calls at once) is shown beside it.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import yaml

from bench.common import readiness, stop
from bench.workloads import grpo_request
from supervisor import RemoteRewardBackend
from supervisor.compose.recipes import build_panel, load_recipe

ROUNDS = 7
TOKEN = "bench-panel-server-token"
RECIPE = {
    "terms": [
        {
            "name": "correct",
            "backend": {
                "kind": "managed",
                "env": "math",
                "scorer": {"name": "math_verify", "params": {"jobs": 1, "warm_replay": 0}},
            },
        },
        {
            "name": "exact",
            "weight": 0.5,
            "backend": {"kind": "managed", "env": "image", "scorer": {"name": "exact_match"}},
        },
        {
            "name": "f1",
            "weight": 0.25,
            "backend": {"kind": "managed", "env": "image", "scorer": {"name": "token_f1"}},
        },
    ]
}


def _started(
    recipe: Path, ready: Path, deadline_s: float = 120
) -> tuple[subprocess.Popen[bytes], dict]:
    """The panel server and its readiness line (bounded)."""
    with open(ready, "w") as out:
        server = subprocess.Popen(
            [sys.executable, "-m", "supervisor", "serve", "--recipe", str(recipe)],
            stdout=out,
            env={**os.environ, "MANAGED_SCORERS_TOKEN": TOKEN},
        )
    try:
        info = readiness(ready, server, deadline_s)
        if info.get("ready") is not True:
            raise RuntimeError(f"the panel server did not start: {info}")
    except BaseException:
        stop(server)
        raise
    return server, info


def main_line(rounds: int = ROUNDS, items: int = 128) -> str:
    """`items`: the step's completions (a multiple of the group, 8; over 64, the default chunk,
    for the chunked client to send more than one chunk)."""
    request = grpo_request(items)
    with tempfile.TemporaryDirectory(prefix="bench-panel-server-") as scratch:
        recipe = Path(scratch) / "reward.yaml"
        recipe.write_text(yaml.safe_dump(RECIPE))
        server, info = _started(recipe, Path(scratch) / "ready.json")
        try:
            url = f"http://127.0.0.1:{info['port']}"
            with (
                build_panel(load_recipe(recipe).train) as local,
                RemoteRewardBackend(
                    url, token=TOKEN, request_batch_size=len(request.items)
                ) as whole,
                RemoteRewardBackend(url, token=TOKEN) as chunked,
            ):
                calls: dict[str, Callable[[], object]] = {
                    "served": lambda: whole.compute_rewards(request),
                    "in_process": lambda: local.compute_rewards(request),
                    "chunked": lambda: chunked.compute_rewards(request),
                }
                samples = _timed(calls, rounds)
                expected = local.compute_rewards(request).rewards
                assert (
                    whole.compute_rewards(request).rewards
                    == expected
                    == chunked.compute_rewards(request).rewards
                )
        finally:
            stop(server, grace_s=30)
    served_s, local_s, chunked_s = (
        statistics.median(samples[k]) for k in ("served", "in_process", "chunked")
    )
    return (
        f"{len(request.items)}-item GRPO panel served (serve --recipe: math_verify + "
        f"exact_match + token_f1) p50 {served_s * 1e3:8.2f} ms  in-process "
        f"{local_s * 1e3:8.2f} ms  overhead {(served_s - local_s) * 1e3:7.2f} ms/batch  "
        f"ratio {served_s / local_s:5.3f}  (default 64-item chunks, overlapping: "
        f"{chunked_s * 1e3:8.2f} ms, ratio {chunked_s / local_s:5.3f})"
    )


def _timed(calls: dict[str, Callable[[], object]], rounds: int) -> dict[str, list[float]]:
    samples: dict[str, list[float]] = {name: [] for name in calls}
    for call in calls.values():  # warm both paths
        call()
    for _ in range(rounds):  # interleaved: machine drift hits both alike
        for name, call in calls.items():
            started = time.perf_counter()
            call()
            samples[name].append(time.perf_counter() - started)
    return samples


if __name__ == "__main__":
    print(main_line())
