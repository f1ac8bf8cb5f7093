"""Many trainer ranks on CPU (gloo): torchrun, and ranks started directly (as Slurm's srun or Ray
would), each owning its managed children and scoring its shard through DistributedRewards.
The ranks run tests/helpers/ranked_trainer.py in envs/trl (torch CPU); their children run from the
shared scorer envs."""

from __future__ import annotations

import json
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO_ROOT, env_python, launcher_free_env, wait_until_gone

TRAINER = REPO_ROOT / "tests" / "helpers" / "ranked_trainer.py"
TIMEOUT_S = 20.0  # DistributedRewards' bound in the ranks: every wait on a peer ends within it
# the node's GPUs as the launcher's environment lists them (no GPU is used)
VISIBLE = ["3", "5", "7", "9"]

pytestmark = pytest.mark.slow


def run_env() -> dict[str, str]:
    return launcher_free_env(CUDA_VISIBLE_DEVICES=",".join(VISIBLE))


def torchrun(ranks: int, out: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    command = [
        str(env_python("trl")),
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={ranks}",
    ]
    command += [str(TRAINER), str(out), "--timeout", str(TIMEOUT_S), *flags]
    return subprocess.run(
        command, env=run_env(), capture_output=True, text=True, timeout=240, cwd=out
    )


def reports(out: Path, ranks: int) -> list[dict[str, Any]]:
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(ranks)]


def child_trees(found: list[dict[str, Any]]) -> list[int]:
    return [
        pid for report in found for child in report["children"].values() for pid in child["tree"]
    ]


def test_torchrun_ranks_score_their_shards_agree_with_one_process_and_fail_together(tmp_path):
    # 4 ranks: groups span rank boundaries, a failure on the last rank reaches 3 peers (a 2-rank
    # run takes the same code with one peer; torchrun with 2 ranks is torn down below)
    ranks = 4
    done = torchrun(ranks, tmp_path, "--fail")
    assert done.returncode == 0, done.stderr[-6000:]
    found = reports(tmp_path, ranks)
    last = ranks - 1

    # each rank's children: its own GPU, labelled with its rank
    for rank, report in enumerate(found):
        assert report["closed"], report
        for name, child in report["children"].items():
            assert child["cuda_visible_devices"] == VISIBLE[rank], (name, child)
            assert child["metrics_rank"] == [str(rank)], (name, child)
            assert f"-rank{rank}-" in child["log"], (name, child)
            assert child["python"] == str(env_python("math" if name == "math_verify" else "image"))
    assert len({pid for report in found for pid in child_trees([report])}) == len(
        child_trees(found)
    )

    first = found[0]["steps"]["1"]
    world, alone = first["world"], first["alone"]
    # groups spanning ranks were rebuilt whole: the judge's win rates match too
    assert world == alone
    assert world["ids"] == [f"s{n}" for n in range(6 * ranks)]
    assert (
        len(set(world["component_rewards"]["rank_in_group"])) > 1
        and 0.0 in world["component_rewards"]["math"]
    )
    assert first["world_samples"] == {"math": 6 * ranks, "rank_in_group": 6 * ranks}
    for rank, report in enumerate(found):
        for step in ("1", "3"):  # step 3 runs after the failed step: the ranks are still in step
            mine = report["steps"][step]
            assert mine["ids"] == world["ids"][6 * rank : 6 * rank + 6]
            assert mine["rewards"] == world["rewards"][6 * rank : 6 * rank + 6]

    failed = [report["steps"]["2"] for report in found]
    assert {f["error"] for f in failed} == {"RankFailed"}
    assert len({f["message"] for f in failed}) == 1, failed  # the same error on every rank
    assert (
        f"failed on rank(s) [{last}] of {ranks}" in failed[0]["message"]
        and "limit 1000" in failed[0]["message"]
    )
    assert [f["cause"] for f in failed] == [None] * last + ["ScorerRequestError"]
    assert max(f["at"] for f in failed) - min(f["at"] for f in failed) < TIMEOUT_S
    for form in ("trl", "trl_async"):  # TRL's per-process calls, sync and async, groups rebuilt
        trl = [reward for report in found for reward in report[form]]
        assert trl == found[0]["trl_alone"] and len(set(trl)) > 1, form
    assert not wait_until_gone(child_trees(found), 10.0)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_a_killed_rank_makes_the_others_raise_rank_lost_within_the_bound(tmp_path):
    """Ranks started directly (no agent to tear the job down): the survivors must not hang."""
    ranks, port = 4, free_port()
    procs = []
    for rank in range(ranks):
        env = run_env() | {
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": str(ranks),
        }
        command = [
            str(env_python("trl")),
            str(TRAINER),
            str(tmp_path),
            "--timeout",
            str(TIMEOUT_S),
            "--die",
        ]
        procs.append(
            subprocess.Popen(command, env=env, cwd=tmp_path, stderr=subprocess.PIPE, text=True)
        )
    codes = [proc.wait(timeout=180) for proc in procs]
    found = reports(tmp_path, ranks)
    assert codes[-1] == -9 and codes[:-1] == [0] * (ranks - 1), [
        p.stderr.read()[-3000:] for p in procs
    ]  # type: ignore[union-attr]
    died_at = found[-1]["steps"]["2"]["died_at"]
    for report in found[:-1]:
        lost = report["steps"]["2"]
        assert lost["error"] == "RankLost" and "timeout_s=20" in lost["message"], lost
        assert lost["at"] - died_at < TIMEOUT_S + 2.0, lost
        assert report["closed"] and "3" not in report["steps"]
    # the killed rank's children too (they watch their parent)
    assert not wait_until_gone(child_trees(found), 10.0)
    for proc in procs:
        proc.stderr.close()  # type: ignore[union-attr]


def test_torchrun_tears_down_every_rank_and_child_when_one_is_killed(tmp_path):
    began = time.monotonic()
    done = torchrun(2, tmp_path, "--die")
    assert done.returncode != 0 and time.monotonic() - began < 120
    assert "exitcode  : -9" in done.stderr or "Signal 9" in done.stderr, done.stderr[-3000:]
    found = reports(tmp_path, 2)
    assert not wait_until_gone(child_trees(found), 10.0)


def test_distributed_rewards_needs_an_initialised_process_group():
    script = (
        "from supervisor.compose.distributed import DistributedRewards\n"
        "from supervisor.backends.local import LocalRewardBackend\n"
        "try:\n"
        "    DistributedRewards(LocalRewardBackend('exact_match'))\n"
        "except Exception as exc:\n"
        "    print(type(exc).__name__, exc)\n"
    )
    done = subprocess.run(
        [str(env_python("trl")), "-c", script], capture_output=True, text=True, timeout=120
    )
    assert done.stdout.startswith(
        "ConfigError DistributedRewards needs torch.distributed initialised"
    ), done
