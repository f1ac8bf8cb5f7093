"""Replicas of one scorer: N children behind one term, each narrowed to its device; a batch is split
across them without cutting a group, and a replica's failure names the replica."""

from __future__ import annotations

import os
import signal
import threading

import psutil
import pytest

from supervisor import (
    ConfigError,
    ManagedScorerProcessSpec,
    ReplicatedBackend,
    RewardItem,
    RewardRequest,
)
from supervisor.backends.managed import ManagedScorerProcessBackend
from supervisor.compose.recipes import make_backend
from supervisor.errors import ScorerProcessDied, ScorerStartupError
from tests.conftest import REPO_ROOT, eventually, wait_until_gone

pytestmark = pytest.mark.slow


def spec(python, replicas: dict, params: dict | None = None) -> ManagedScorerProcessSpec:
    return ManagedScorerProcessSpec(
        process={
            "python_executable": str(python),
            "startup_timeout": 60,
            "extra_import_paths": [str(REPO_ROOT)],
        },
        scorer={"name": "tests.helpers.fixture_scorers:WhereScored", "params": params or {}},
        restart={"backoff_s": 0},
        replicas=replicas,
    )


def grouped(groups: int, size: int, prefix: str = "i") -> RewardRequest:
    items = [
        RewardItem(id=f"{prefix}{g}-{m}", group_id=f"{prefix}{g}", text="x")
        for g in range(groups)
        for m in range(size)
    ]
    return RewardRequest(items=items, group_size=size)


@pytest.fixture
def replicated():
    made = []

    def make(*args, **kwargs):
        backend = ReplicatedBackend(spec(*args, **kwargs))
        made.append(backend)
        return backend

    yield make
    for backend in made:
        backend.close()


def test_one_child_per_device_a_batch_split_evenly_and_no_group_cut(
    replicated, trainer_python, monkeypatch
):
    # what the launcher gave us
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "10,11,12,13,14,15,16,17,18,19")
    # CUDA ordinals, as this process sees
    backend = replicated(trainer_python, {"devices": ["4", "6", "cuda:9"]})
    pids = backend.pids
    assert len(set(pids)) == 3
    for pid, device in zip(pids, ["14", "16", "19"], strict=True):
        assert psutil.Process(pid).environ()["CUDA_VISIBLE_DEVICES"] == device
    # started together, not one after another
    created = [psutil.Process(pid).create_time() for pid in pids]
    ready = [
        c + r.timings["spawn_to_ready_s"] for c, r in zip(created, backend.replicas, strict=True)
    ]
    assert max(created) < min(ready), (created, ready)

    request = grouped(6, 4)
    response = backend.compute_rewards(request)
    assert response.ids == request.ids
    by_item = dict(zip(response.ids, response.component_rewards["pid"], strict=True))
    device_of = dict(zip(pids, [14.0, 16.0, 19.0], strict=True))
    for item_id, pid, device in zip(
        response.ids,
        response.component_rewards["pid"],
        response.component_rewards["device"],
        strict=True,
    ):
        assert device == device_of[int(pid)], item_id  # each item's row is its own replica's answer
    for g in range(6):  # a group is scored by one replica
        assert len({by_item[f"i{g}-{m}"] for m in range(4)}) == 1
    counts = sorted(list(by_item.values()).count(float(pid)) for pid in pids)
    assert counts == [8, 8, 8]
    assert response.diagnostics["where_scored"]["sample_count"] == 24


def test_least_loaded_sends_a_concurrent_call_to_the_idle_replica(replicated, trainer_python):
    backend = replicated(trainer_python, {"count": 2, "split": "least_loaded"}, {"sleep_s": 1.0})
    assert [psutil.Process(pid).environ()["CUDA_VISIBLE_DEVICES"] for pid in backend.pids] == [
        "0",
        "0",
    ]
    answers = {}

    def call(name: str) -> None:
        answers[name] = backend.compute_rewards(grouped(1, 4, name)).component_rewards["pid"]

    first = threading.Thread(target=call, args=("a",))
    first.start()
    assert eventually(lambda: any(backend._load), 10.0)  # the first call's group is in flight
    call("b")
    first.join(30)
    assert len(set(answers["a"])) == 1 and len(set(answers["b"])) == 1
    assert answers["a"][0] != answers["b"][0]  # `even` would have put both on replica 0


def test_a_failed_replica_fails_its_share_naming_it_and_is_restarted_alone(
    replicated, trainer_python
):
    backend = replicated(trainer_python, {"count": 2})
    survivor, victim = backend.pids
    os.kill(victim, signal.SIGKILL)
    assert wait_until_gone([victim], 10) == []
    with pytest.raises(ScorerProcessDied) as caught:
        backend.compute_rewards(grouped(4, 2))
    message = str(caught.value)
    assert message.startswith(
        f"replica 1/2 of 'where_scored' (pid {victim}), share of 4 ids from 'i2-0': "
    )
    assert f"pid={victim} status=signal SIGKILL" in message  # the child's record is still there
    assert isinstance(caught.value.__cause__, ScorerProcessDied) and "replica" not in str(
        caught.value.__cause__
    )
    response = backend.compute_rewards(grouped(4, 2))  # replica 1 restarted; replica 0 untouched
    assert backend.pids[0] == survivor and backend.pids[1] not in (None, victim)
    assert set(response.component_rewards["pid"]) == {float(p) for p in backend.pids}


def test_replica_config_is_checked_and_make_backend_builds_replicas(trainer_python):
    with pytest.raises(ValueError, match="count 2 != 3 devices"):
        spec(trainer_python, {"count": 2, "devices": ["0", "1", "2"]})
    with pytest.raises(ValueError, match="distinct single GPUs"):
        spec(trainer_python, {"devices": ["0", "0"]})
    with pytest.raises(
        ConfigError,
        match="asks for 2 replicas: build it with supervisor.compose.replicas.ReplicatedBackend",
    ):
        ManagedScorerProcessBackend(spec(trainer_python, {"count": 2}), start=False)
    backend = make_backend(spec(trainer_python, {"count": 2}))
    try:
        assert isinstance(backend, ReplicatedBackend) and len(set(backend.pids)) == 2
        pids = backend.pids
    finally:
        backend.close()
    assert wait_until_gone(pids, 10) == []


def test_a_panels_children_start_together_and_a_failed_start_leaves_none(trainer_python):
    from supervisor import PanelConfig, build_panel

    def term(name: str, scorer: str, params: dict | None = None) -> dict:
        return {
            "name": name,
            "backend": spec(trainer_python, {}).model_dump(mode="json")
            | {"scorer": {"name": scorer, "params": params or {}}},
        }

    config = PanelConfig(
        terms=[
            term("a", "tests.helpers.fixture_scorers:WhereScored"),
            term("b", "tests.helpers.fixture_scorers:WhereScored", {"sleep_s": 0.01}),
            term("c", "tests.helpers.fixture_scorers:Probe"),
        ]
    )
    panel = build_panel(config)
    try:
        backends = panel.backends
        created = [psutil.Process(b.pid).create_time() for b in backends]
        ready = [c + b.timings["spawn_to_ready_s"] for c, b in zip(created, backends, strict=True)]
        # not one after another
        assert len(backends) == 3 and max(created) < min(ready), (created, ready)
        pids = [b.pid for b in backends]
    finally:
        panel.close()
    assert wait_until_gone(pids, 10) == []

    broken = PanelConfig(
        terms=[
            term("a", "tests.helpers.fixture_scorers:WhereScored"),
            term("b", "tests.helpers.fixture_scorers:LoadFails"),
        ]
    )
    before = {p.pid for p in psutil.Process().children()}
    with pytest.raises(ScorerStartupError, match="missing.safetensors not found"):
        build_panel(broken)
    assert wait_until_gone(list({p.pid for p in psutil.Process().children()} - before), 10) == []


def test_devices_are_this_processes_cuda_ordinals_and_replicas_split_sensibly(trainer_python):
    from supervisor.compose.replicas import replica_devices
    from supervisor.config import ReplicasConfig

    config = ReplicasConfig(devices=["0", "cuda:1"])
    assert replica_devices(config, {}) == ["0", "1"]
    assert replica_devices(config, {"CUDA_VISIBLE_DEVICES": "4,5,6"}) == ["4", "5"]
    with pytest.raises(
        ConfigError, match=r"entry 'cuda:1': this process was given only GPUs \['4'\]"
    ):
        replica_devices(config, {"CUDA_VISIBLE_DEVICES": "4"})
    with pytest.raises(ConfigError, match="under torchrun with 8 ranks on this node"):
        replica_devices(config, {"LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "8", "WORLD_SIZE": "8"})
    assert replica_devices(
        config, {"LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1", "WORLD_SIZE": "8"}
    ) == ["0", "1"]
    with pytest.raises(ConfigError, match="not a CUDA ordinal"):
        replica_devices(ReplicasConfig(devices=["gpu0"]), {})

    backend = ReplicatedBackend(spec(trainer_python, {"count": 2}), start=False)
    # a big group last: it goes to the second replica, not after the small ones
    sizes = [1, 1, 1, 100]
    items = [
        RewardItem(id=f"g{g}-{m}", group_id=f"g{g}", text="x")
        for g, n in enumerate(sizes)
        for m in range(n)
    ]
    assert [len(share) for share in backend._split(RewardRequest(items=items), None)] == [3, 100]
    backend.close()


def test_ctrl_c_while_replicas_boot_kills_them_at_once(trainer_python):
    import time

    config = spec(trainer_python, {"count": 2}).model_copy(
        update={
            "scorer": spec(trainer_python, {}).scorer.model_copy(
                update={"name": "tests.helpers.fixture_scorers:LoadHangs"}
            )
        }
    )
    before = {p.pid for p in psutil.Process().children()}
    timer = threading.Timer(1.5, lambda: os.kill(os.getpid(), signal.SIGINT))
    # the Ctrl-C handler this relies on, whatever the launcher left (a background job ignores
    # SIGINT)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        began = time.monotonic()
        timer.start()
        with pytest.raises(KeyboardInterrupt):
            ReplicatedBackend(config)  # both children hang in load(); startup_timeout is 60 s
        elapsed = time.monotonic() - began
        timer.join()
    finally:
        signal.signal(signal.SIGINT, previous)
    assert elapsed < 6.0, elapsed  # not the 60 s boot deadline
    assert wait_until_gone(list({p.pid for p in psutil.Process().children()} - before), 10) == []
