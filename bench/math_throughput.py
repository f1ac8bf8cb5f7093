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

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from multiprocessing import get_context
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
MATH_PYTHON = ROOT / "envs" / "math" / ".venv" / "bin" / "python"
BATCH = 16
N_ITEMS = 128
WARMUP_ITEMS = 32  # graded by the pool before timing (a different range of items)
BATCH_TIMEOUT_S = 120.0
GRADE_MODULE = "scorers.builtin.math_verify_grade"


def workload(start: int, n: int) -> list[tuple[str, str]]:
    """n distinct (completion, gold) pairs: fractions vs decimals, percents, integers,
    polynomials, radicals, and wrong answers -- all graded in milliseconds when warm."""
    pairs = []
    for i in range(start, start + n):
        a = i % 9 + 2
        kind = [
            (f"\\boxed{{\\frac{{1}}{{{i + 2}}}}}", repr(1 / (i + 2))),
            (f"\\boxed{{{i}\\%}}", repr(i / 100)),
            (f"\\boxed{{{7 * i + 3}}}", str(7 * i + 3)),
            (f"\\boxed{{(x+{i})^2}}", f"$x^2+{2 * i}x+{i * i}$"),
            (f"\\boxed{{\\sqrt{{{2 * i * i}}}}}", f"${i}\\sqrt{{2}}$"),
            (f"so $x = {i + 1}$", str(i)),  # wrong
            (f"\\boxed{{{i}/{i + 1}}}", f"$\\frac{{{i}}}{{{i + 1}}}$"),
            (f"\\boxed{{\\frac{{{i}}}{{2}} + \\frac{{1}}{{3}}}}", f"$\\frac{{{3 * i + 2}}}{{6}}$"),
            (f"\\boxed{{(x+{a})(x-{a})}}", f"$x^2+{a * a}$"),  # wrong
        ][i % 9]
        pairs.append((f"Problem {i}: working through it step by step, the result is {kind[0]}.", kind[1]))
    return pairs


def _grade_batch(conn, tasks: list[tuple]) -> None:
    """Baseline child: grade the batch sequentially, send the rewards back, exit."""
    from scorers.builtin.math_verify_grade import grade  # preloaded in the forkserver: no import cost

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
            raise TimeoutError(f"baseline child pid {child.pid} gave no result within {BATCH_TIMEOUT_S}s")
        try:
            rewards, child_grading_s = reader.recv()
        except EOFError:
            child.join(5.0)
            raise RuntimeError(f"baseline child pid {child.pid} died: exit status {child.exitcode}") from None
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
        scorer.load("cpu")  # starts the forkserver (preload: math_verify + the grade module) and the workers
        ctx = get_context("forkserver")
        ctx.set_forkserver_preload(["math_verify", GRADE_MODULE])  # a no-op now: the same server serves both
        warm = workload(items, warmup)
        score_checked(scorer, [ScoreItem(id=f"w{i}", text=t, reference=g) for i, (t, g) in enumerate(warm)])
        _one_child(ctx, [(t, g, *params) for t, g in warm[:2]])  # first forkserver child, untimed
        for b, batch in enumerate(batches):
            graded = [ScoreItem(id=f"b{b}i{i}", text=t, reference=g) for i, (t, g) in enumerate(batch)]
            tasks = [(t, g, *params) for t, g in batch]
            runs = {
                "pool": lambda graded=graded: score_checked(scorer, graded).terms["math_verify"],
                "base": lambda tasks=tasks: _one_child(ctx, tasks),
            }
            out: dict[str, Any] = {}
            for side in ("pool", "base") if b % 2 == 0 else ("base", "pool"):  # alternate who goes first
                started = time.perf_counter()
                out[side] = runs[side]()
                elapsed[side] += time.perf_counter() - started
            ours, (theirs, graded_s) = out["pool"], out["base"]
            child_grading_s += graded_s
            if ours != theirs:
                raise AssertionError(f"batch {b}: pool rewards {ours} != one-child rewards {theirs}")
    finally:
        scorer.close()  # kills the workers; the last pool also stops the forkserver it started
    pool_s, base_s = elapsed["pool"], elapsed["base"]
    pool, base = items / pool_s, items / base_s
    per_batch = 1000 / len(batches)
    return (
        f"math throughput ({cores} cores)       pool {pool:7.1f} items/s  one-child-per-batch {base:7.1f} items/s"
        f"  ratio {pool / base:.2f}  (child per batch: {child_grading_s * per_batch:.0f} ms grading cold,"
        f" {(base_s - child_grading_s) * per_batch:.0f} ms start+join; pool {pool_s * per_batch:.0f} ms/batch)"
    )


def in_math_env(module: str, measure: Callable[..., str], **sizes: Any) -> str:
    """`measure(**sizes)` here when this is the math env's python (antlr 4.13.2), else
    `python -m module SIZES_JSON` run there (its `sizes_of_argv()`); its last line."""
    if Path(sys.prefix).resolve() == MATH_PYTHON.parent.parent.resolve():
        return measure(**sizes)
    done = subprocess.run(
        [str(MATH_PYTHON), "-m", module, json.dumps(sizes)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,  # a backstop against a hang, as bench.__main__.run_driver's: hostile_math's full run takes 300 s loaded
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    if done.returncode != 0:
        raise RuntimeError(f"{module} failed ({done.returncode}): {done.stderr[-2000:]}")
    return done.stdout.strip().splitlines()[-1]


def sizes_of_argv() -> dict[str, Any]:
    """The sizes `in_math_env` passed (a JSON object as the first argument), or none: the defaults."""
    return json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}


def main_line(items: int = N_ITEMS, warmup: int = WARMUP_ITEMS) -> str:
    """The bench line, measured under the math env's python."""
    return in_math_env("bench.math_throughput", _measure, items=items, warmup=warmup)


if __name__ == "__main__":
    print(main_line(**sizes_of_argv()))
