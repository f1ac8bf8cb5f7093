"""One trainer rank, as torchrun starts it (or a test, with the same variables): it owns its own
managed children, scores its shard through DistributedRewards and writes what it saw to
OUT/rank<R>.json. Run in envs/trl (torch CPU) by tests/trainers/test_ranks.py.

The shard: 6 items per rank, in groups of 4 laid out as a trainer lays them out, so groups
span rank boundaries. The panel: math_verify (pointwise, envs/math) and pairwise_judge over
token_f1 (groupwise: a candidate's reward depends on its whole group, envs/image).

Steps: 1 scores and (rank 0) checks the gathered rewards against the same panel run on every
item in one process; 2 fails a required term on the last rank (`--fail`) or kills the last rank
(`--die`); 3 scores again; then TRL's reward-function shape over the judge alone.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import psutil
import torch.distributed as dist

from supervisor import ManagedScorerProcessBackend, RewardItem, RewardRequest
from supervisor.adapters.trl import TRLRewardFunction
from supervisor.compose.distributed import DistributedRewards
from supervisor.compose.panel import PanelTerm, RewardPanel

GROUP, PER_RANK = 4, 6


def dataset(world: int) -> list[RewardItem]:
    items = []
    for n in range(world * PER_RANK):
        g = n // GROUP
        a, b = g + 2, 3 * g + 1
        answer = a + b if (n * 7 + g) % 3 else a + b + 1 + n % 2
        words = " ".join(["the", "sum", "is"][: 1 + n % 3])
        items.append(
            RewardItem(
                id=f"s{n}",
                group_id=f"p{g}",
                prompt=f"what is {a} + {b} ?",
                # token_f1 varies with the words and the answer
                text=f"{words} {answer} so \\boxed{{{answer}}}",
                reference=str(a + b),
            )
        )
    return items


def panel(log_dir: str) -> tuple[RewardPanel, list[ManagedScorerProcessBackend]]:
    process = {"request_timeout": 60, "log_dir": log_dir, "keep_clean_logs": True}
    math = ManagedScorerProcessBackend(
        {
            "env": "math",
            "process": process,
            "scorer": {"name": "math_verify", "params": {"jobs": 1}},
            "limits": {"max_text_chars": 1000},  # what --fail exceeds on one rank
        }
    )
    judge = ManagedScorerProcessBackend(
        {
            "env": "image",
            "process": process,
            "scorer": {"name": "pairwise_judge", "params": {"inner": "token_f1"}},
        }
    )
    terms = [PanelTerm("math", math), PanelTerm("rank_in_group", judge, weight=0.5)]
    return RewardPanel(terms), [math, judge]


def child_facts(backend: ManagedScorerProcessBackend) -> dict[str, Any]:
    child = backend._child
    assert child is not None and child.port is not None
    metrics = httpx.get(
        f"http://127.0.0.1:{child.port}/metrics",
        headers={"authorization": f"Bearer {child.token}"},
        timeout=10,
    ).text
    process = psutil.Process(child.pid)
    return {
        "pid": child.pid,
        "tree": [child.pid, *(p.pid for p in process.children(recursive=True))],
        "python": process.cmdline()[0],  # every rank's child runs the one shared scorer env
        "cuda_visible_devices": process.environ().get("CUDA_VISIBLE_DEVICES"),
        "metrics_rank": sorted(
            {
                line.split('rank="')[1].split('"')[0]
                for line in metrics.splitlines()
                if 'rank="' in line
            }
        ),
        "log": Path(backend.log_path or "").name,
    }


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument(
        "--fail", action="store_true", help="step 2: a required term fails on the last rank"
    )
    parser.add_argument(
        "--die", action="store_true", help="step 2: the last rank kills itself with SIGKILL"
    )
    parser.add_argument("--timeout", type=float, default=20.0)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    report: dict[str, Any] = {"rank": rank, "pid": os.getpid(), "steps": {}}
    out = args.out / f"rank{rank}.json"

    def save() -> None:  # atomic: torchrun may SIGTERM this rank mid-write when a peer dies
        partial = out.with_suffix(".partial")
        partial.write_text(json.dumps(report))
        os.replace(partial, out)

    everything = dataset(world)
    shard = everything[rank * PER_RANK : (rank + 1) * PER_RANK]
    rewards, backends = panel(str(args.out / "logs"))
    scorer = DistributedRewards(rewards, timeout_s=args.timeout)
    # TRL's shape: a reward function per process over its slice, groups of num_generations laid out
    # process-major (TRL passes no group ids): the judge alone, through the TRL adapter
    trl = TRLRewardFunction(
        DistributedRewards(backends[1], timeout_s=args.timeout),
        num_generations=GROUP,
        close_at_exit=False,
    )
    report["children"] = {b.spec.scorer.name: child_facts(b) for b in backends}
    save()
    dist.barrier()
    try:
        for step in (1, 2, 3):
            items = shard
            if step == 2 and rank == world - 1:
                if args.die:
                    report["steps"][step] = {"died_at": time.time()}
                    save()
                    os.kill(os.getpid(), signal.SIGKILL)
                if args.fail:
                    # its group is all here
                    items = [*shard[:-1], shard[-1].model_copy(update={"text": "x" * 2000})]
            began = time.monotonic()
            try:
                response = scorer.compute_rewards(RewardRequest(items=items, group_size=GROUP))
            except Exception as exc:  # noqa: BLE001 - recorded for the test to judge
                report["steps"][step] = {
                    "error": type(exc).__name__,
                    "message": str(exc),
                    "cause": type(exc.__cause__).__name__ if exc.__cause__ else None,
                    "seconds": time.monotonic() - began,
                    "at": time.time(),
                }
                save()
                if type(exc).__name__ == "RankLost":
                    break
                continue
            record: dict[str, Any] = {
                "ids": response.ids,
                "rewards": response.rewards,
                "seconds": time.monotonic() - began,
                "exchanged_bytes": scorer.exchanged_bytes,  # received so far, all exchanges
            }
            if rank == 0:
                world_response = scorer.world_response
                assert world_response is not None
                alone = rewards.compute_rewards(RewardRequest(items=everything, group_size=GROUP))
                record["world"] = world_response.model_dump(exclude={"diagnostics"})
                record["alone"] = alone.model_dump(exclude={"diagnostics"})
                record["world_samples"] = {
                    t: r["sample_count"] for t, r in world_response.diagnostics.items()
                }
            report["steps"][step] = record
            save()
        else:  # every step ran: the TRL step
            columns = {
                "prompts": [item.prompt for item in shard],
                "completions": [item.text for item in shard],
                "solution": [item.reference for item in shard],
            }
            # TRL passes its TrainerState: the step is checked across ranks
            state = SimpleNamespace(global_step=4)
            report["trl"] = trl(**columns, trainer_state=state)
            report["trl_async"] = asyncio.run(trl.as_async()(**columns, trainer_state=state))
            if rank == 0:  # the same batch as one TRL process would score it
                os.environ["WORLD_SIZE"] = "1"
                alone = TRLRewardFunction(backends[1], num_generations=GROUP, close_at_exit=False)
                report["trl_alone"] = alone(
                    prompts=[i.prompt for i in everything],
                    completions=[i.text for i in everything],
                    solution=[i.reference for i in everything],
                )
            save()
    finally:
        rewards.close()
    report["closed"] = True
    save()
    sys.stdout.flush()
    os._exit(0)  # a broken gloo group can block in its destructor; everything we own is closed


if __name__ == "__main__":
    sys.exit(main())
