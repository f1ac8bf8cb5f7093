"""Math grading throughput on this machine's cores: our pool vs one forkserver child per batch.

`envs/math/.venv/bin/python -m bench.math_throughput` prints one line; `main_line()` returns it.

Why: MathVerifyScorer keeps a GradingPool of warm forkserver workers (one per usable
core) alive across calls. The simpler design starts a fresh process for every batch.
Both sides here grade the same distinct items (each seen once, batches of 16, a GRPO
group) with the same function (`scorers.builtin.math_verify_grade.grade`) and the same params,
and fork from the same forkserver, which preloads math_verify and is started before
timing. The baseline pays what that design pays per batch: process start, grading the
batch sequentially in the new child (whose lazily built state -- antlr's prediction
DFA, sympy's caches -- starts empty every time), the result pipe and the join. Batches
alternate which side goes first, so machine noise falls on both. Rewards must match.
The line also splits the baseline's batch into the child's (cold) grading and start+join.
"""

from __future__ import annotations

import os
import time
from multiprocessing import get_context
from typing import Any

from bench.common import in_math_env, sizes_of_argv, workload

BATCH = 16
N_ITEMS = 128
WARMUP_ITEMS = 32  # graded by the pool before timing (a different range of items)
BATCH_TIMEOUT_S = 120.0
GRADE_MODULE = "scorers.builtin.math_verify_grade"


def _grade_batch(conn, tasks: list[tuple]) -> None:
    """Baseline child: grade the batch sequentially, send the rewards back, exit."""
    # preloaded in the forkserver: no import cost
    from scorers.builtin.math_verify_grade import grade

    started = time.perf_counter()
    rewards = [grade(*task) for task in tasks]
    conn.send((rewards, time.perf_counter() - started))
    conn.close()


def _one_child(ctx, tasks: list[tuple]) -> tuple[list[float], float]:
    """Start one forkserver child for the batch, collect its rewards, join it (all bounded)."""
    reader, writer = ctx.Pipe(duplex=False)
    child = ctx.Process(target=_grade_batch, args=(writer, tasks), name="batch-grader", daemon=True)
    try:
        child.start()
        writer.close()
        if not reader.poll(BATCH_TIMEOUT_S):
            raise TimeoutError(
                f"baseline child pid {child.pid} gave no result within {BATCH_TIMEOUT_S}s"
            )
        try:
            rewards, child_grading_s = reader.recv()
        except EOFError:
            child.join(5.0)
            raise RuntimeError(
                f"baseline child pid {child.pid} died: exit status {child.exitcode}"
            ) from None
        child.join(BATCH_TIMEOUT_S)
        if child.exitcode != 0:
            raise RuntimeError(f"baseline child pid {child.pid} exit status {child.exitcode}")
        return rewards, child_grading_s
    finally:
        reader.close()
        if child.pid is not None and child.exitcode is None:
            child.kill()
            child.join(5.0)


def _measure(items: int = N_ITEMS, warmup: int = WARMUP_ITEMS) -> str:
    from scorers.base import ScoreItem, score_checked
    from scorers.builtin.math_verify import MathVerifyScorer

    cores = len(os.sched_getaffinity(0))
    scorer = MathVerifyScorer(jobs=cores)
    params = (scorer.float_rounding, scorer.numeric_precision, scorer.strict)
    pairs = workload(0, items)
    batches = [pairs[i : i + BATCH] for i in range(0, items, BATCH)]
    elapsed, child_grading_s = {"pool": 0.0, "base": 0.0}, 0.0
    try:
        # starts the forkserver (preload: math_verify + the grade module) and the workers
        scorer.load("cpu")
        ctx = get_context("forkserver")
        # a no-op now: the same server serves both
        ctx.set_forkserver_preload(["math_verify", GRADE_MODULE])
        warm = workload(items, warmup)
        score_checked(
            scorer, [ScoreItem(id=f"w{i}", text=t, reference=g) for i, (t, g) in enumerate(warm)]
        )
        _one_child(ctx, [(t, g, *params) for t, g in warm[:2]])  # first forkserver child, untimed
        for b, batch in enumerate(batches):
            graded = [
                ScoreItem(id=f"b{b}i{i}", text=t, reference=g) for i, (t, g) in enumerate(batch)
            ]
            tasks = [(t, g, *params) for t, g in batch]
            runs = {
                "pool": lambda graded=graded: score_checked(scorer, graded).terms["math_verify"],
                "base": lambda tasks=tasks: _one_child(ctx, tasks),
            }
            out: dict[str, Any] = {}
            # alternate who goes first
            for side in ("pool", "base") if b % 2 == 0 else ("base", "pool"):
                started = time.perf_counter()
                out[side] = runs[side]()
                elapsed[side] += time.perf_counter() - started
            ours, (theirs, graded_s) = out["pool"], out["base"]
            child_grading_s += graded_s
            if ours != theirs:
                raise AssertionError(
                    f"batch {b}: pool rewards {ours} != one-child rewards {theirs}"
                )
    finally:
        scorer.close()  # kills the workers; the last pool also stops the forkserver it started
    pool_s, base_s = elapsed["pool"], elapsed["base"]
    pool, base = items / pool_s, items / base_s
    per_batch = 1000 / len(batches)
    return (
        f"math throughput ({cores} cores)       pool {pool:7.1f} items/s  "
        f"one-child-per-batch {base:7.1f} items/s  ratio {pool / base:.2f}  (child per "
        f"batch: {child_grading_s * per_batch:.0f} ms grading cold, "
        f"{(base_s - child_grading_s) * per_batch:.0f} ms start+join; pool "
        f"{pool_s * per_batch:.0f} ms/batch)"
    )


def main_line(items: int = N_ITEMS, warmup: int = WARMUP_ITEMS) -> str:
    """The bench line, measured under the math env's python."""
    return in_math_env("bench.math_throughput", _measure, items=items, warmup=warmup)


if __name__ == "__main__":
    print(main_line(**sizes_of_argv()))
