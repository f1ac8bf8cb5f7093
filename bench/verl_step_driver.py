"""Runs in envs/trl (verl 0.9.1): verl's reward loop on one fixed batch, graded two ways,
interleaved. Printed as one JSON line; bench/verl_step.py makes the line of `make bench` from it.

One `RewardLoopWorker` (verl's in-process reward loop, naive manager, one task per item) per way:
- managed: the shipped entry point, examples/verl_compute_score.py's `compute_score` (math_verify
  in its managed child, envs/math, `jobs: 2`; the per-item tasks coalesced by the backend's stream);
- verl: verl's own `math_verify.compute_score` (bench/verl_own_math_verify.py), in this env, whose
  antlr is 4.9.3 (hydra-core and omegaconf pin it: verl's config cannot load without them).
The batch is the math throughput mix without its percent answers, which antlr 4.9.3 grades wrong
in-process; how many rewards verl's own grader gets wrong on the whole mix is reported beside.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import workload
from tests.helpers.verl_reward_loop import batch, config, tokenizer_dir

ROOT = Path(__file__).resolve().parent.parent
PATHS = {
    "managed": str(ROOT / "examples" / "verl_compute_score.py"),
    "verl": str(ROOT / "bench" / "verl_own_math_verify.py"),
}


def rewards_of(worker: Any, data: Any) -> tuple[list[float], float]:
    started = time.perf_counter()
    outputs = worker.loop.run_until_complete(worker.compute_score_batch(data))
    return [float(o["reward_score"]) for o in outputs], time.perf_counter() - started


def narrow_verls_pool(width: int) -> None:
    """The smoke run's: verl's own grader on `width` spawn workers instead of its 4, each of which
    imports verl (about 10 s of CPU here, the line's largest cost at smoke size), started at once.
    The same function in the same kind of process, graded the same; verl makes its pool only where
    none is set."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    from verl.utils.reward_score import math_verify as verls

    spawn = multiprocessing.get_context("spawn")
    verls._pool = ProcessPoolExecutor(max_workers=width, mp_context=spawn)
    for _ in range(width):  # each worker spawned now: it imports verl while the batch is built
        verls._pool.submit(os.getpid)


def run(items: int, rounds: int, pool_width: int = 0) -> dict[str, Any]:
    """`pool_width`: verl's own pool's workers (0: verl's own 4; the smoke run's: fewer)."""
    from transformers import AutoTokenizer
    from verl.experimental.reward_loop import RewardLoopWorker

    if pool_width:
        narrow_verls_pool(pool_width)

    mix = workload(1000, items * 9 // 8 + 9)
    # verl boxes the gold itself: a bare expression
    mix = [(text, gold.strip("$")) for text, gold in mix]
    rows = [[text, gold] for text, gold in mix if "\\%" not in text][:items]
    whole = [[text, gold] for text, gold in mix[:items]]
    with tempfile.TemporaryDirectory() as out:
        tok = tokenizer_dir(rows + whole, Path(out) / "tokenizer")
        tokenizer = AutoTokenizer.from_pretrained(tok)
        data, everything = batch(rows, tokenizer), batch(whole, tokenizer)
        workers = {
            name: RewardLoopWorker(config("naive", "compute_score", 1, "unused", tok, path))
            for name, path in PATHS.items()
        }
        for worker in workers.values():
            # warm: the child boots, verl's pool spawns; not the reference, as verl's own grader
            # scores 0 what passes its 30 s timeout, which its cold pool's first call can on a
            # loaded machine
            rewards_of(worker, data)
        # each way's rewards in its first round, the others must repeat
        got: dict[str, list[float]] = {}
        seconds: dict[str, list[float]] = {name: [] for name in workers}
        for _ in range(rounds):
            for name, worker in workers.items():
                rewards, took = rewards_of(worker, data)
                if got.setdefault(name, rewards) != rewards:
                    raise RuntimeError(f"{name}: rewards changed between rounds")
                seconds[name].append(took)
        on_all = {name: rewards_of(worker, everything)[0] for name, worker in workers.items()}
    return {
        "items": len(rows),
        "seconds": {name: statistics.median(values) for name, values in seconds.items()},
        "mismatches": sum(a != b for a, b in zip(got["managed"], got["verl"], strict=True)),
        "right": sum(got["managed"]) / len(rows),
        "whole_mix": len(whole),
        "whole_mix_disagree": sum(
            a != b for a, b in zip(on_all["managed"], on_all["verl"], strict=True)
        ),
    }


if __name__ == "__main__":
    os.environ["MATH_PYTHON"] = sys.argv[3]
    width = int(sys.argv[4]) if len(sys.argv) > 4 else 0
    print(json.dumps(run(int(sys.argv[1]), int(sys.argv[2]), width)))
