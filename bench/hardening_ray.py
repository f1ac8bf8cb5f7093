"""Scenarios of issue 37 for the Ray reward pool (items 5 and 1), measured: rows of bench.hardening.

Public API only, so the same file measures an older tree ("before") and this one ("now"). The Ray
side runs in envs/ray's python (`python -m bench.hardening_ray ray DIR` prints one JSON line), on a
local Ray with one raylet as bench.ray_pool does; both rows come from that one run. The scorer is
tests.helpers.stamped_scorer's `Stamped` (its verdict and identity from a file, a hang on cue), in
2 actors, each with its own managed child from envs/image.
"""

from __future__ import annotations

import functools
import json
import os
import re
import signal
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RAY_PYTHON = ROOT / "envs" / "ray" / ".venv" / "bin" / "python"
# the figures; a second backend's shorter deadline
HANG_S, CALL_S, SHORT_CALL_S = 9.0, 3.0, 1.0
TIMEOUT_S = 300


def _texts(prefix: str, hang: bool = False) -> Any:
    from supervisor import RewardItem, RewardRequest

    items = [
        RewardItem(
            id=f"{prefix}{n}",
            group_id=f"{prefix}g{n // 2}",
            text="hang" if hang and n == 0 else "ok",
        )
        for n in range(4)
    ]
    return RewardRequest(items=items, group_size=2)


def _attempt(call: Any) -> dict[str, Any]:
    from supervisor import ScorerError

    began = time.monotonic()
    try:
        return {"rewards": call().rewards, "s": time.monotonic() - began}
    except ScorerError as exc:
        return {"error": f"{type(exc).__name__}: {_short(str(exc))}", "s": time.monotonic() - began}


def _short(message: str) -> str:
    """An error's first clause, for a table cell: the actor by index, ids and hashes shortened."""
    said = re.sub(
        r"^Ray pool '\w+' actor (\d)/\d \(node \w+ \([\d.]+\), pid \d+\)", r"actor \1", message
    )
    said = re.sub(r"its share of \d+ ids from '\w+'", "its share", said.splitlines()[0])
    said = re.sub(r"\b([0-9a-f]{12})[0-9a-f]{52}\b", r"\1...", said)
    return said.split("; ")[0]


def _until(check: Any, timeout_s: float) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.1)
    raise TimeoutError(f"not within {timeout_s} s")


def ray_side(temp_dir: str) -> dict[str, Any]:
    """A hang past the deadline (with a shorter call queued behind it), then calls until one is
    served; then actor 0 restarted by Ray after its node's stamp changed, and one call."""
    import ray

    from supervisor.compose.ray_pool import RayPoolBackend, actor_name

    folder = Path(temp_dir)
    stamp, mark = folder / "stamp", folder / "hanging"
    stamp.write_text("1")
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        _temp_dir=str(folder / "ray"),
        object_store_memory=128 * 1024 * 1024,
    )
    params = {"stamp_file": str(stamp), "hang_s": HANG_S, "hang_mark": str(mark)}
    pool = RayPoolBackend.create(
        {
            "name": "hardening",
            "actors": 2,
            "num_cpus": 0,
            "max_restarts": 2,
            "call_timeout_s": CALL_S,
            "scorer": {
                "env": "image",
                "process": {"extra_import_paths": [str(ROOT)]},
                "scorer": {"name": "tests.helpers.stamped_scorer:Stamped", "params": params},
            },
        }
    )
    found: dict[str, Any] = {}
    try:
        short = RayPoolBackend.connect("hardening", timeout_s=60, call_timeout_s=SHORT_CALL_S)
        began = time.monotonic()
        hung = pool.submit(_texts("h", hang=True))
        _until(mark.exists, 60)
        found["queued"] = _attempt(lambda: short.compute_rewards(_texts("q")))
        calls = [_attempt(lambda: hung.result(timeout=120))]
        while "error" in calls[-1] and len(calls) < 8:  # call after call until one is served
            request = _texts(f"n{len(calls)}")
            calls.append(_attempt(functools.partial(pool.compute_rewards, request)))
        found["calls"], found["served_after_s"] = calls, time.monotonic() - began

        handle = ray.get_actor(actor_name("hardening", 0), namespace="managed-scorers")
        victim = ray.get(handle.info.remote(), timeout=60)["pid"]
        # the node's scorer changes: actor 0's next child has another identity
        stamp.write_text("2")
        os.kill(victim, signal.SIGKILL)

        def restarted() -> bool:
            try:
                return bool(ray.get(handle.info.remote(), timeout=30)["pid"] != victim)
            except ray.exceptions.RayActorError:
                return False

        _until(restarted, 90)
        found["restamped"] = _attempt(lambda: pool.compute_rewards(_texts("m")))
    finally:
        pool.kill()
        ray.shutdown()
    return found


@functools.cache
def _measured() -> dict[str, Any] | str:
    """The Ray side's findings, run once for both rows; a string says why there are none."""
    if (ROOT / "envs" / "ray" / "UNAVAILABLE").exists() or not RAY_PYTHON.exists():
        return "SKIPPED (envs/ray is not built here: `make env-ray`)"
    from bench.common import run_ray_side  # the trainer's side only: the Ray side runs in envs/ray

    found, _ = run_ray_side(RAY_PYTHON, "bench.hardening_ray", "the Ray hardening side", TIMEOUT_S)
    return found


def late_share() -> str:
    """Item 5: one share hangs 9 s, call_timeout_s 3 s; a 1 s call queued behind it; then calls
    until one is served."""
    found = _measured()
    if isinstance(found, str):
        return found
    calls = found["calls"]
    failed = [c for c in calls if "error" in c]
    return (
        f"{len(failed)} failed call(s), then one served {found['served_after_s']:.1f} s "
        f"after the hang began (its call {calls[-1]['s']:.1f} s); the hung call: "
        f"{failed[0]['error'] if failed else 'served'}; a 1 s call queued behind it: "
        f"{found['queued'].get('error', 'served')}"
    )


def restarted_identity() -> str:
    """Item 1 (Ray pool): actor 0 SIGKILLed after its node's scorer changed (stamp 1 -> 2), Ray
    restarts it; one call."""
    found = _measured()
    if isinstance(found, str):
        return found
    got = found["restamped"]
    return (
        f"rewards {got['rewards']} (two identities in one call)"
        if "rewards" in got
        else got["error"]
    )


SCENARIOS = [
    ("Ray pool: a share hangs 9 s past call_timeout_s 3 s", late_share),
    ("Ray pool: an actor restarted by Ray under another identity", restarted_identity),
]


if __name__ == "__main__":
    if sys.argv[1:2] == ["ray"]:
        print(json.dumps(ray_side(sys.argv[2])))
    else:
        for name, scenario in SCENARIOS:
            print(f"| {name} | {scenario()} |", flush=True)
