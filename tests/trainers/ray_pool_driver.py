"""A Ray driver process for tests/trainers/test_ray_pool.py, run by envs/ray's python with the
checkout first on PYTHONPATH: one step of the test per run, its findings as one JSON file.

    python ray_pool_driver.py STEP ADDRESS POOL OUT [SEED]

create: start the pool (2 actors on `reward_node`, detached so later drivers find it) and score;
create-job: a 1-actor pool with `lifetime: job`, scored, then the driver exits without closing it;
score: connect by name and score; kill-actor: freeze actor 0, send a call, SIGKILL the actor, then
score again; kill-pool: connect and kill every actor; late-then-restamped: a 2-actor pool of
`Stamped` scorers whose share hangs past the call's deadline while a shorter call queues behind it,
then the next call; then actor 0 SIGKILLed after its node's stamp changed (Ray restarts it under
another identity) and a call; hedged: a 3-actor pool whose actor 0's child is SIGSTOPped mid-call.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import ray

import supervisor
from supervisor import LocalRewardBackend, RewardItem, RewardRequest
from supervisor.compose.ray_pool import RayPoolBackend, actor_name

GROUP = 4
ROOT = Path(supervisor.__file__).resolve().parent.parent
LATE_CALL_S = 4.0  # the stamped pool's call deadline: its hung share is cancelled there
# a second backend's, shorter: its share is still queued behind the hang at its deadline
QUEUED_CALL_S = 1.0


def batch(seed: int, groups: int = 6) -> RewardRequest:
    """Groups of 4 images, some large enough (76.8 KB) for the actor's shared segment."""
    rng = np.random.default_rng(seed)
    items = []
    for n in range(groups * GROUP):
        side = 160 if n % 3 == 0 else 32
        image = rng.integers(0, 256, (side, side, 3), dtype=np.uint8)
        items.append(RewardItem(id=f"s{seed}-{n}", group_id=f"g{n // GROUP}", image=image))
    return RewardRequest(items=items, group_size=GROUP)


def scored(pool: RayPoolBackend, seed: int) -> dict[str, Any]:
    request = batch(seed)
    with LocalRewardBackend("mean_intensity") as local:
        expected = local.compute_rewards(request).rewards
    got = pool.compute_rewards(request)
    return {
        "equal": got.rewards == expected,
        "ids": got.ids == request.ids,
        "n": len(request.items),
    }


def refused(pool: RayPoolBackend) -> dict[str, Any]:
    """An item the scorer cannot take (text, no image): the actor's own typed error, named with
    it."""
    try:
        items = [RewardItem(id=f"bad{n}", group_id="b", text="no image") for n in range(GROUP)]
        pool.compute_rewards(RewardRequest(items=items))
    except supervisor.ScorerError as exc:
        return {"type": type(exc).__name__, "message": str(exc).splitlines()[0]}
    return {}


def image_pool(name: str, **options: Any) -> dict[str, Any]:
    """A pool of mean_intensity children from the image env: `options` over these defaults."""
    return {
        "name": name,
        "max_restarts": 2,
        "start_timeout_s": 120,
        "call_timeout_s": 60,
        "scorer": {
            "env": "image",
            "scorer": {"name": "mean_intensity", "input_kind": "image"},
            "client": {"group_size": GROUP, "input_kind": "image"},
        },
        **options,
    }


def create(
    pool_name: str, seed: int, lifetime: str = "detached", actors: int = 2
) -> dict[str, Any]:
    options = {"actors": actors, "num_cpus": 1, "resources": {"reward_node": 1}}
    pool = RayPoolBackend.create(image_pool(pool_name, lifetime=lifetime, **options))
    reward_nodes = [
        n["NodeID"] for n in ray.nodes() if n["Alive"] and "reward_node" in n["Resources"]
    ]
    return {"actors": pool.actors(), "reward_nodes": reward_nodes, **scored(pool, seed)}


def kill_actor(pool: RayPoolBackend, seed: int) -> dict[str, Any]:
    before = pool.actors()
    victim = before[0]
    os.kill(victim["pid"], signal.SIGSTOP)  # the call is sure to be in flight when the actor dies
    future = pool.submit(batch(seed))
    time.sleep(1.0)
    os.kill(victim["pid"], signal.SIGKILL)
    error: dict[str, Any] = {}
    try:
        future.result(timeout=60)
    except supervisor.ScorerError as exc:
        error = {
            "type": type(exc).__name__,
            "message": str(exc),
            "node_id": getattr(exc, "node_id", None),
            "actor_pid": getattr(exc, "actor_pid", None),
        }
    began = time.monotonic()
    after = {"served": scored(pool, seed + 1), "s": time.monotonic() - began}
    return {"before": before, "error": error, "after": after, "actors": pool.actors()}


def texts(prefix: str, hang: bool = False) -> RewardRequest:
    """Two groups of 2 (one share for each actor); with `hang`, the first group's share hangs."""
    items = [
        RewardItem(
            id=f"{prefix}{n}",
            group_id=f"{prefix}g{n // 2}",
            text="hang" if hang and n == 0 else "ok",
        )
        for n in range(4)
    ]
    return RewardRequest(items=items, group_size=2)


def attempt(call: Any) -> dict[str, Any]:
    """The call's rewards, or its error with the fields a pool error names."""
    try:
        return {"rewards": call().rewards}
    except supervisor.ScorerError as exc:
        fields = ("actor", "node_id", "actor_pid", "expected", "got")
        return {
            "error": {
                "type": type(exc).__name__,
                "message": str(exc),
                **{f: getattr(exc, f, None) for f in fields},
            }
        }


def waited(check: Any, timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.1)
    raise TimeoutError(f"{what}: not within {timeout_s} s")


def late_then_restamped(pool_name: str) -> dict[str, Any]:
    stamp, mark = Path("stamp").resolve(), Path("hanging").resolve()
    stamp.write_text("1")
    params = {"stamp_file": str(stamp), "hang_s": 120.0, "hang_mark": str(mark)}
    pool = RayPoolBackend.create(
        {
            "name": pool_name,
            "actors": 2,
            "num_cpus": 0,
            "lifetime": "job",
            "max_restarts": 2,
            "start_timeout_s": 120,
            "call_timeout_s": LATE_CALL_S,
            "hedge": False,  # shares wait for their own actor: what a queued share does is shown
            "scorer": {
                "env": "image",
                "process": {"extra_import_paths": [str(ROOT)]},
                "scorer": {"name": "tests.helpers.stamped_scorer:Stamped", "params": params},
            },
        }
    )
    report: dict[str, Any] = {
        "identity": pool.identity_hash,
        "children": [a["child_pid"] for a in pool.actors()],
    }
    try:
        short = RayPoolBackend.connect(
            pool_name, timeout_s=60, call_timeout_s=QUEUED_CALL_S, hedge=False
        )
        hung = pool.submit(texts("h", hang=True))
        waited(mark.exists, 60, "the hanging share to reach its scorer")
        report["queued"] = attempt(lambda: short.compute_rewards(texts("q")))
        report["hung"] = attempt(lambda: hung.result(timeout=120))
        # the next call waits out the restart policy's backoff (the late share's kill counts against
        # it)
        patient = RayPoolBackend.connect(pool_name, timeout_s=60, call_timeout_s=60, hedge=False)
        began = time.monotonic()
        report["next"] = attempt(lambda: patient.compute_rewards(texts("n")))
        report["next_s"] = time.monotonic() - began

        handles = [
            ray.get_actor(actor_name(pool_name, i), namespace="managed-scorers") for i in range(2)
        ]
        victim = ray.get(handles[0].info.remote(), timeout=60)
        # the node's scorer env changes: a new child of actor 0 has another identity
        stamp.write_text("2")
        os.kill(victim["pid"], signal.SIGKILL)

        def restarted() -> dict[str, Any] | None:
            try:
                info = ray.get(handles[0].info.remote(), timeout=30)
            except ray.exceptions.RayActorError:
                return None
            return info if info["pid"] != victim["pid"] else None

        again = waited(restarted, 90, "Ray to restart actor 0")
        report["victim"] = {"pid": victim["pid"], "child_pid": victim["child_pid"]}
        report["restarted"] = {
            "pid": again["pid"],
            "node_id": again["node_id"],
            "child_pid": again["child_pid"],
            "identity": again["shape"].identity_hash,
        }
        report["mixed"] = attempt(lambda: pool.compute_rewards(texts("m")))
        report["children"] += [ray.get(h.info.remote(), timeout=60)["child_pid"] for h in handles]
    finally:
        pool.kill()
    return report


def hedged(pool_name: str) -> dict[str, Any]:
    """A 3-actor pool warmed up (its hedge delay learnt), then one actor's child SIGSTOPped: the
    next call's share there is hedged to another actor, and the call ends long before its 60 s."""
    config = image_pool(pool_name, actors=3, num_cpus=0, lifetime="job")
    pool = RayPoolBackend.create(config)
    try:
        warm = [scored(pool, seed)["equal"] for seed in range(5)]
        child = pool.actors()[0]["child_pid"]
        os.kill(child, signal.SIGSTOP)
        try:
            request = batch(100)
            began = time.monotonic()
            got = pool.compute_rewards(request)
            took = time.monotonic() - began
        finally:
            os.kill(child, signal.SIGCONT)
        with LocalRewardBackend("mean_intensity") as local:
            expected = local.compute_rewards(request).rewards
        values = got.diagnostics[pool.shape.name]["values"]
        hedges = {k: v for k, v in values.items() if k.startswith("runtime.hedges")}
        after = scored(pool, 101)["equal"]  # the withdrawn share's child served on
    finally:
        pool.kill()
    return {"warm": warm, "equal": got.rewards == expected, "took": took, "hedges": hedges,
            "after": after, "child": child}  # fmt: skip


def main() -> int:
    step, address, pool_name, out = sys.argv[1:5]
    seed = int(sys.argv[5]) if len(sys.argv) > 5 else 0
    ray.init(address=address, namespace="managed-scorers", log_to_driver=False)
    report: dict[str, Any] = {"supervisor": supervisor.__file__, "driver_pid": os.getpid()}
    try:
        if step == "create":
            report.update(create(pool_name, seed))
        elif step == "create-job":  # and exit without closing it: Ray ends it with this driver
            report.update(create(pool_name, seed, lifetime="job", actors=1))
        elif step == "hedged":
            report.update(hedged(pool_name))
        elif step == "late-then-restamped":
            report.update(late_then_restamped(pool_name))
        else:
            pool = RayPoolBackend.connect(pool_name, timeout_s=120, call_timeout_s=60)
            if step == "score":
                report.update(
                    {"actors": pool.actors(), "refused": refused(pool), **scored(pool, seed)}
                )
            elif step == "kill-actor":
                report.update(kill_actor(pool, seed))
            elif step == "kill-pool":
                report["actors"] = pool.actors()
                pool.kill()
            pool.close()
    finally:
        Path(out).write_text(json.dumps(report, default=str))  # a ScorerShape as text
        ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
