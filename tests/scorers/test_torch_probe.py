"""torch_probe (a synthetic model of a chosen size) on CPU in the embed env: resident, per_call and
the offload/onload figures; and the GPU check itself, run dry on the CPU, plus its carried
wheels."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from supervisor import RewardItem, RewardRequest, ScorerStartupError
from tests.conftest import REPO_ROOT, env_python

pytestmark = pytest.mark.slow
MIB = 2**20
REQUEST = RewardRequest(
    items=[
        RewardItem(id="empty", text=""),  # a zero input: tanh(W @ 0) = 0 exactly
        RewardItem(id="short", text="a cat"),
        RewardItem(id="long", text="the cat sat on the mat " * 100),
    ]
)


@pytest.fixture(scope="module")
def embed_python():
    return env_python("embed")


@pytest.fixture(scope="module")
def resident(embed_python):
    """A resident 8 MiB probe: the first test moves it out and back (and checks it scores as
    before), the second only scores with it."""
    from tests.helpers.shared_child import shared_child

    with shared_child(embed_python, "torch_probe", params={"param_mib": 8}) as backend:
        yield backend


def test_resident_probe_scores_deterministically_and_reports_its_size(
    managed, embed_python, resident
):
    backend = resident
    rewards = backend.compute_rewards(REQUEST).rewards
    assert rewards[0] == 0.0 and rewards[1] != rewards[2] and all(-1.0 < r < 1.0 for r in rewards)
    again = managed(embed_python, "torch_probe", params={"param_mib": 8})
    assert again.compute_rewards(REQUEST).rewards == rewards  # the seed decides the weights
    other = managed(embed_python, "torch_probe", params={"param_mib": 8, "seed": 1})
    assert other.compute_rewards(REQUEST).rewards[1:] != rewards[1:]
    assert backend.identity_hash != other.identity_hash  # the seed is part of what it scores
    off = backend.offload()
    assert (
        off["residency"] == "offloaded" and off["param_bytes"] == 8 * MIB and off["device"] == "cpu"
    )
    assert off["before"]["rss_bytes"] > 8 * MIB and "cuda_allocated_bytes" not in off["before"]
    on = backend.onload()
    assert on["residency"] == "resident" and on["param_bytes"] == 8 * MIB
    # the same weights after the round trip
    assert backend.compute_rewards(REQUEST).rewards == rewards


def test_per_call_probe_moves_around_each_call_with_the_same_rewards(
    managed, embed_python, resident
):
    per_call = managed(
        embed_python, "torch_probe", params={"param_mib": 8}, gpu_residency="per_call"
    )
    assert per_call.health()["residency"] == "offloaded"
    assert per_call.compute_rewards(REQUEST).rewards == resident.compute_rewards(REQUEST).rewards
    health = per_call.health()
    assert health["residency"] == "offloaded" and health["gpu_residency"] == "per_call"


@pytest.mark.parametrize("params", [{"param_mib": 0}, {"param_mib": True}, {"seed": -1}])
def test_bad_params_refuse_the_child(managed, embed_python, params):
    with pytest.raises(ScorerStartupError, match="torch_probe: (param_mib|seed) must be an int"):
        managed(embed_python, "torch_probe", params=params)


def test_the_gpu_check_runs_dry_on_the_cpu():
    done = subprocess.run(
        # one size: the bench runs the same steps for each size it is given
        [sys.executable, "-m", "bench.gpu_residency", "--device", "cpu", "--sizes", "4"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    for size in (4,):
        assert (
            f"| torch_probe {size} MiB: per_call call (onload + score + offload) / resident call |"
            in out
        )
        assert re.search(
            rf"torch_probe {size} MiB: offload / onload p50 \(3 rounds\) \| [\d.]+ / [\d.]+ ms", out
        )
    assert (
        "same rewards" in out and "| two 4 MiB children: the other's rss when one offloads |" in out
    )
    assert "| text_similarity: rss resident -> offloaded |" in out  # the embed env has MiniLM
    assert "skipped | cpu: no device memory" in out and "gpu_residency: done in" in out


def test_the_carried_wheels_are_the_pinned_list_for_the_gpu_machines_python(tmp_path):
    from bench import gpu_wheels

    wheels = gpu_wheels.download(tmp_path, "3.12")
    names = sorted(re.sub(r"[-_.]+", "_", w.name.split("-")[0]).lower() for w in wheels)
    pinned = sorted(re.sub(r"[-_.]+", "_", pin.split("==")[0]).lower() for pin in gpu_wheels.pins())
    assert names == pinned
    # pydantic_core, built for it
    assert any("cp312" in w.name and "manylinux" in w.name for w in wheels)
    # the engine rows' transformers[serving] is most of it (32 MB); with the tree (about 4 MB) it
    # travels inside the device's 64 MiB carry
    assert sum(w.stat().st_size for w in wheels) < 40 * MIB
