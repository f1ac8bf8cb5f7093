"""The Ray reward pool on a real two-raylet cluster made on this machine: a head node and a second
raylet carrying `reward_node`; driver processes from envs/ray (the checkout first on PYTHONPATH).

Shown: the pool's actors are placed on the second raylet; two driver processes score through the
same named pool at once, equal to in-process; a killed actor's in-flight call gets PoolActorDied
naming its node and pid, Ray restarts the actor and the next call is served; the killed pool leaves
no scorer process (psutil); a `lifetime: job` pool ends, children included, with the driver that
made it; a share hung past the call's deadline is cancelled where it is (queued or scoring, said so)
and costs that call alone; an actor Ray restarted under another identity is refused, never joined.
The cluster is ended by its own processes (found by the marker every process of it inherits), not
`ray stop`, which would end every Ray on the machine.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from bench.common import MARKER, ray_processes
from tests.conftest import REPO_ROOT, launcher_free_env, wait_until_gone
from tests.helpers.limited_openai import LimitedOpenAI
from tests.trainers.test_ray_actor import ray_python

DRIVER = Path(__file__).with_name("ray_pool_driver.py")
POOL = "rewards"


def _free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _node_ports() -> list[str]:
    """Every port a raylet opens, its own: two raylets on one machine must not collide."""
    names = ("node-manager", "object-manager", "runtime-env-agent", "dashboard-agent-grpc",
             "dashboard-agent-listen", "metrics-export")  # fmt: skip
    return [
        f"--{name}-port={port}" for name, port in zip(names, _free_ports(len(names)), strict=True)
    ]


def _cluster_processes(temp_dir: str) -> list[psutil.Process]:
    """This cluster's processes: those carrying its marker, their descendants (Ray's agents retitle
    themselves and zero their environ block), and any process holding a file under its temp dir."""
    found = {proc.pid: proc for proc in ray_processes(temp_dir)}
    for proc in list(found.values()):
        try:
            found.update({child.pid: child for child in proc.children(recursive=True)})
        except psutil.NoSuchProcess:
            continue
    for proc in psutil.process_iter():
        if proc.pid in found or proc.pid == os.getpid():
            continue
        try:
            held = any(f.path.startswith(temp_dir) for f in proc.open_files())
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
        if held:
            found[proc.pid] = proc
    return list(found.values())


def _stop(temp_dir: str) -> int:
    """`ray stop` for this cluster alone: SIGTERM its processes, SIGKILL what is left after 5 s;
    returns how many needed SIGKILL."""
    procs = _cluster_processes(temp_dir)
    for proc in procs:
        with contextlib.suppress(psutil.NoSuchProcess):  # gone on its own meanwhile: what we wanted
            proc.terminate()
    _, alive = psutil.wait_procs(procs, timeout=5.0)
    for proc in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()
    psutil.wait_procs(alive, timeout=10.0)
    return len(alive)


@pytest.fixture(scope="module")
def cluster():
    python = ray_python()
    temp_dir = tempfile.mkdtemp(prefix="msrp")  # short: Ray's socket paths live under it
    env = launcher_free_env(HOME=temp_dir, RAY_USAGE_STATS_ENABLED="0", PYTHONPATH=str(REPO_ROOT))
    env[MARKER] = temp_dir
    env.pop("CUDA_VISIBLE_DEVICES", None)
    ray = str(python.parent / "ray")
    (gcs_port,) = _free_ports(1)
    address = f"127.0.0.1:{gcs_port}"
    # worker ports 0: random, as ray.cluster_utils starts several nodes on one machine
    common = [
        "--node-ip-address=127.0.0.1",
        "--num-cpus=2",
        "--object-store-memory=100000000",
        # fmt: skip
        "--disable-usage-stats",
        f"--temp-dir={temp_dir}",
        "--min-worker-port=0",
        "--max-worker-port=0",
    ]
    try:
        for extra in (
            ["--head", f"--port={gcs_port}", "--include-dashboard=false",
             "--resources", '{"head": 1}'],
            [f"--address={address}", "--resources", '{"reward_node": 2}'],
        ):  # fmt: skip
            # a file, not a pipe: the daemons it starts inherit it
            log = Path(temp_dir) / "ray-start.log"
            with log.open("a") as out:
                done = subprocess.run(
                    [ray, "start", *common, *_node_ports(), *extra],
                    env=env,
                    stdout=out,
                    stderr=out,
                    timeout=120,
                )
            assert done.returncode == 0, log.read_text()[-4000:]
        yield {"address": address, "env": env, "python": str(python), "temp_dir": temp_dir}
    finally:
        killed = _stop(temp_dir)
        assert not _cluster_processes(temp_dir), "processes of the test cluster survived"
        # its logs and sockets, once nothing of it is left
        shutil.rmtree(temp_dir, ignore_errors=True)
        print(f"test cluster stopped ({killed} processes needed SIGKILL)")


def _driver(
    cluster: dict[str, Any], tmp_path: Path, step: str, seed: int = 0, pool: str = POOL
) -> subprocess.Popen[str]:
    out = tmp_path / f"{step}-{seed}.json"
    command = [cluster["python"], str(DRIVER), step, cluster["address"], pool, str(out), str(seed)]
    return subprocess.Popen(
        command, env=cluster["env"], cwd=tmp_path, stderr=subprocess.PIPE, text=True
    )


def _report(
    process: subprocess.Popen[str], tmp_path: Path, step: str, seed: int = 0
) -> dict[str, Any]:
    try:
        _, stderr = process.communicate(timeout=150)
    except subprocess.TimeoutExpired:
        process.kill()
        _, stderr = process.communicate(timeout=10)
        pytest.fail(f"driver {step} passed 150 s:\n{stderr[-3000:]}")
    assert process.returncode == 0, f"driver {step} failed:\n{stderr[-4000:]}"
    report = json.loads((tmp_path / f"{step}-{seed}.json").read_text())
    # this checkout's code
    assert report["supervisor"].startswith(str(REPO_ROOT)), report["supervisor"]
    return report


def _run(
    cluster: dict[str, Any], tmp_path: Path, step: str, seed: int = 0, pool: str = POOL
) -> dict[str, Any]:
    return _report(_driver(cluster, tmp_path, step, seed, pool), tmp_path, step, seed)


def _scorer_children(cluster: dict[str, Any]) -> list[psutil.Process]:
    """This cluster's scorer processes: the image env's python running child_runtime."""
    venv = REPO_ROOT / "envs" / "image" / ".venv"
    pythons = {str(venv / "bin" / "python"), str(venv.resolve() / "bin" / "python")}
    found = []
    for proc in ray_processes(cluster["temp_dir"]):
        try:
            cmdline = proc.cmdline()
        except psutil.NoSuchProcess:
            continue
        if cmdline[:1] and cmdline[0] in pythons and "child_runtime" in cmdline:
            found.append(proc)
    return found


@pytest.mark.slow
def test_a_pool_on_reward_nodes_serves_two_drivers_survives_an_actor_kill_and_dies_whole(
    cluster, tmp_path
):
    created = _run(cluster, tmp_path, "create")
    assert created["equal"] and created["ids"], created
    (reward_node,) = created["reward_nodes"]
    actors = created["actors"]
    # placed on the second raylet
    assert [a["node_id"] for a in actors] == [reward_node, reward_node], actors
    assert len({a["pid"] for a in actors}) == 2 and all(a["child_pid"] for a in actors), actors

    # two drivers at once
    drivers = {seed: _driver(cluster, tmp_path, "score", seed) for seed in (1, 2)}
    for seed, process in drivers.items():
        report = _report(process, tmp_path, "score", seed)
        assert report["equal"] and report["ids"], report
        assert [a["pid"] for a in report["actors"]] == [a["pid"] for a in actors]  # the same pool
        # raised in the actor: its own typed error, prefixed with the actor
        refused = report["refused"]
        assert refused["type"] in ("ScorerRequestError", "ScorerItemsFailed"), refused
        assert refused["message"].startswith("Ray pool 'rewards' actor 0/2 (node "), refused

    killed = _run(cluster, tmp_path, "kill-actor", 3)
    victim = killed["before"][0]
    error = killed["error"]
    assert error["type"] == "PoolActorDied", killed
    assert error["node_id"] == reward_node and error["actor_pid"] == victim["pid"], error
    assert reward_node in error["message"] and f"pid {victim['pid']}" in error["message"], error[
        "message"
    ]
    # Ray restarted the actor: the next call is served
    assert killed["after"]["served"]["equal"], killed
    restarted = killed["actors"][0]
    assert restarted["pid"] != victim["pid"] and restarted["node_id"] == reward_node, restarted
    assert not wait_until_gone([victim["child_pid"]], 10.0), "the killed actor's child outlived it"

    before = _scorer_children(cluster)
    assert len(before) == 2, before
    ended = _run(cluster, tmp_path, "kill-pool")
    child_pids = [a["child_pid"] for a in ended["actors"]]
    assert sorted(child_pids) == sorted(p.pid for p in before)
    assert not wait_until_gone(child_pids, 10.0), "a scorer child outlived the killed pool"
    deadline = time.monotonic() + 10.0
    while _scorer_children(cluster) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _scorer_children(cluster) == []

    # lifetime job: ends with its driver
    job = _run(cluster, tmp_path, "create-job", 4, pool="jobpool")
    assert job["equal"], job
    (only,) = job["actors"]
    assert not wait_until_gone([only["pid"], only["child_pid"]], 15.0), (
        "a job pool outlived its driver"
    )


def test_without_ray_the_pool_says_what_it_needs():
    """The trainer env has no Ray: the pool refuses with the fix, and nothing imported it before."""
    import importlib.util

    from supervisor import ConfigError, RayPoolBackend

    if importlib.util.find_spec("ray") is not None:
        pytest.skip("Ray is installed in this environment")
    with pytest.raises(ConfigError, match=r"pip install 'managed-scorers\[ray\]'"):
        RayPoolBackend.create(
            {
                "name": "p",
                "scorer": {
                    "env": "image",
                    "scorer": {"name": "mean_intensity", "input_kind": "image"},
                },
            }
        )


@pytest.mark.slow
def test_a_late_share_is_cancelled_where_it_is_and_an_answer_of_another_identity_is_refused(
    cluster, tmp_path
):
    """A share hung past the call's deadline costs that call alone: its child is killed, the next
    call is served; a call queued behind it says so. An actor Ray restarted under another identity
    (its node's scorer changed) contributes nothing to a call, and the error names it, its node and
    pid, both hashes."""
    found = _run(cluster, tmp_path, "late-then-restamped", pool="stamped")
    queued, hung = found["queued"]["error"], found["hung"]["error"]
    assert queued["type"] == "ScorerTimeout", queued
    assert (
        "was still queued when the call's deadline passed" in queued["message"]
        and "scoring" not in queued["message"]
    ), queued
    assert hung["type"] == "ScorerTimeout" and "was scoring" in hung["message"], hung
    assert hung["message"].startswith("Ray pool 'stamped' actor 0/2 (node "), hung
    # the hang cost one call, not the next
    assert found["next"] == {"rewards": [1.0] * 4}, found["next"]

    victim, restarted = found["victim"], found["restarted"]
    assert restarted["identity"] != found["identity"], found
    mixed = found["mixed"]["error"]  # never [2.0, 2.0, 1.0, 1.0]: two identities in one call
    assert mixed["type"] == "PoolIdentityChanged", found["mixed"]
    assert (mixed["actor"], mixed["node_id"], mixed["actor_pid"]) == (
        "stamped.0",
        restarted["node_id"],
        restarted["pid"],
    )
    assert (mixed["expected"], mixed["got"]) == (found["identity"], restarted["identity"]), mixed
    assert found["identity"] in mixed["message"] and restarted["identity"] in mixed["message"], (
        mixed
    )
    assert f"pid {restarted['pid']}" in mixed["message"], mixed
    children = {victim["child_pid"], *found["children"]}
    assert not wait_until_gone(sorted(children), 15.0), "a child of the stamped pool outlived it"


@pytest.mark.slow
def test_a_share_on_a_stopped_actor_is_hedged_to_another_and_the_call_ends_early(cluster, tmp_path):
    """Three actors, their hedge delay learnt over five calls; one actor's child SIGSTOPped: the
    call's share there is sent once more to another actor past the delay, the call ends in
    seconds, not at its 60 s deadline, with the rewards in-process gives; the withdrawn share
    never cost its child, which serves the next call once it runs again."""
    found = _run(cluster, tmp_path, "hedged", pool="hedged")
    assert found["warm"] == [True] * 5 and found["equal"] and found["after"], found
    assert found["took"] < 15.0, found
    print(f"hedged call: {found['took']:.2f} s, {found['hedges']}")
    hedges = found["hedges"]
    assert hedges["runtime.hedges_won"] >= 1, found
    assert hedges["runtime.hedges_sent"] >= hedges["runtime.hedges_won"], found
    assert not wait_until_gone([found["child"]], 15.0), "the stopped child outlived its pool"


@pytest.mark.slow
def test_one_endpoint_limit_holds_across_two_raylets_only_with_the_coordinator(cluster, tmp_path):
    """Eight judge ranks, four on each raylet, each node with its own limits files (two machines
    share none), against an endpoint that takes 3 in flight and 24 a second: each node's own limit
    lets it see more than 3 at once; with the coordinator actor (`coordinate_on_ray`) it never sees
    more than 3 or more than 24 a second, refuses nothing, and every item is judged."""
    driver = str(Path(__file__).with_name("ray_limits_driver.py"))
    found = {}
    with LimitedOpenAI(concurrency=3, per_second=24, base_s=0.1) as local:
        with LimitedOpenAI(concurrency=3, per_second=24, base_s=0.1) as shared:
            for mode, server in (("local", local), ("coordinated", shared)):
                out = tmp_path / f"{mode}.json"
                command = [cluster["python"], driver, cluster["address"], server.base_url, mode,
                           str(tmp_path / mode), str(out)]  # fmt: skip
                done = subprocess.run(
                    command, env=cluster["env"], capture_output=True, text=True, timeout=180
                )
                assert done.returncode == 0, done.stderr[-4000:]
                found[mode] = json.loads(out.read_text())
    assert local.peak_in_flight > 3, vars(local)
    ranks = found["coordinated"]["ranks"]
    assert len({r["node"] for r in ranks}) == 2, ranks
    assert [(r["rewards"], r["errors"]) for r in ranks] == [([0.7] * 4, {})] * 8, ranks
    assert shared.throttled == 0 and shared.peak_in_flight <= 3, vars(shared)
    assert shared.peak_per_second() <= 24 and len(shared.arrivals) == 32, vars(shared)
    coordinator = found["coordinated"]["coordinator"]  # the actor's: its node's address
    assert coordinator["MANAGED_SCORERS_LIMITS_COORDINATOR"].startswith("http://"), coordinator
    assert len(coordinator["MANAGED_SCORERS_LIMITS_TOKEN"]) >= 32, coordinator
