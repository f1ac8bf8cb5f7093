"""math_verify under hostile completions: 512 ordinary items plus 8 pathological ones, in one run.

`envs/math/.venv/bin/python -m bench.hostile_math` prints one line; `main_line()` returns it.

The pool is the one MathVerifyScorer runs (`jobs: 2`, `timeout_s: 5`, the same grade function,
preload and warm-up), driven directly so each item's completion time is known. Measured in
one run, on warm workers, medians of interleaved rounds:
- ordinary throughput: the clean batch (512 items) through our pool and through the
  slot-per-item design (`overflow: 0`: every slow item keeps its slot until its timeout, the
  design before the soft deadline), 4 rounds, alternating who goes first;
- the cost of pathological items: 3 rounds of the clean batch, then the same batch with 8
  pathological items spread through it at fixed positions, both through our pool (a hostile
  batch leaves freshly forked workers in the slots, so both batches run on such workers);
- the hostile batch once through the slot-per-item design.
Targets: the hostile batch costs at most timeout_s + 1 s more than the clean one, and the
throughput on ordinary items drops by at most 5 % against the slot-per-item design. When the
512 ordinary items of the hostile batch were all done, and how many ordinary items were moved
to overflow, are printed too. Verdicts on the ordinary items must equal the clean batch's in
every round; the pool's resident memory after a hostile batch is printed beside its memory
before (the highest of the rounds).
"""

from __future__ import annotations

import os
import random
import statistics
import time

JOBS, TIMEOUT_S, ORDINARY = 2, 5.0, 512
CLEAN_ROUNDS, HOSTILE_ROUNDS = 4, 3
PATHOLOGICAL = (
    "\\boxed{9^{9^{9^{9}}}}",
    "\\boxed{(10^{9})!}",
    "\\boxed{(x+1)^{100000}}",
    "\\boxed{10^{10^{10}}}",
    "\\boxed{8^{8^{8^{8}}}}",
    "\\boxed{(10^{8})!}",
    "\\boxed{(x+2)^{100000}}",
    "\\boxed{2^{2^{36}}}",
)


def batches() -> tuple[list[tuple], list[tuple], list[int]]:
    """(clean tasks, hostile tasks, where the ordinary ones sit in the hostile batch)."""
    from bench.math_throughput import workload

    clean = [(text, gold, 6, 15, True) for text, gold in workload(0, ORDINARY)]
    spots = sorted(random.Random(0).sample(range(ORDINARY + len(PATHOLOGICAL)), len(PATHOLOGICAL)))
    hostile: list[tuple] = []
    ordinary = iter(clean)
    hazards = iter(PATHOLOGICAL)
    for position in range(ORDINARY + len(PATHOLOGICAL)):
        hostile.append((next(hazards), "1", 6, 15, True) if position in spots else next(ordinary))
    kept = [i for i in range(len(hostile)) if i not in spots]
    return clean, hostile, kept


def pool_rss(pool) -> int:
    total = 0
    for pid in pool.worker_pids():
        with open(f"/proc/{pid}/statm") as statm:
            total += int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    return total


def _measure() -> str:
    from bench.math_throughput import workload
    from scorers.grading_pool import GradingPool
    from scorers.math_verify import GRADE_FN, WARM_MODULE

    clean, hostile, kept = batches()
    warm = [(text, gold, 6, 15, True) for text, gold in workload(ORDINARY, 64)]
    pools = {
        name: GradingPool(JOBS, TIMEOUT_S, GRADE_FN, preload=["math_verify", WARM_MODULE], overflow=overflow)
        for name, overflow in (("ours", None), ("slots", 0))
    }
    try:
        for pool in pools.values():
            pool.start()
            pool.grade(warm)
        ours = pools["ours"]
        took: dict[str, list[float]] = {"ours": [], "slots": [], "clean": [], "hostile": []}
        done_at: list[float] = []
        moved: list[int] = []  # ordinary items our pool moved to overflow (clean and hostile batches)
        memory: list[tuple[int, int]] = []
        for round_ in range(CLEAN_ROUNDS):  # the clean batch through both designs, alternating who goes first
            for name in ("ours", "slots") if round_ % 2 == 0 else ("slots", "ours"):
                began = time.monotonic()
                graded = pools[name].grade(clean)
                took[name].append(time.monotonic() - began)
                if name == "ours":
                    reference = graded
                    moved.append(sum(o.overflowed for o in graded))
        for _ in range(HOSTILE_ROUNDS):  # then clean and hostile through ours: workers as fresh for both
            began = time.monotonic()
            moved.append(sum(o.overflowed for o in ours.grade(clean)))
            took["clean"].append(time.monotonic() - began)
            before = pool_rss(ours)
            began = time.monotonic()
            outcomes = ours.grade(hostile)
            took["hostile"].append(time.monotonic() - began)
            done_at.append(max(outcomes[i].finished_at for i in kept) - began)
            memory.append((before, pool_rss(ours)))
            moved.append(sum(outcomes[i].overflowed for i in kept))
            if [outcomes[i].value for i in kept] != [o.value for o in reference]:
                raise AssertionError("verdicts on the ordinary items changed next to the pathological ones")
        ours_s, slots_clean_s = statistics.median(took["ours"]), statistics.median(took["slots"])
        clean_s, hostile_s = statistics.median(took["clean"]), statistics.median(took["hostile"])
        last_ordinary = statistics.median(done_at)
        memory_before, memory_after = max(b for b, _ in memory), max(a for _, a in memory)
        began = time.monotonic()
        pools["slots"].grade(hostile)
        slots_s = time.monotonic() - began
    finally:
        for pool in pools.values():
            pool.close()
    bad = sorted({o.status for i, o in enumerate(outcomes) if i not in kept})
    drop = 1 - slots_clean_s / ours_s  # ordinary throughput, ours against the slot-per-item design
    extra = hostile_s - clean_s
    return (
        f"hostile math ({JOBS} jobs, timeout {TIMEOUT_S:g} s)   clean {ORDINARY} items {ours_s:5.2f} s"
        f" ({ORDINARY / ours_s:.0f} items/s; slot-per-item design {ORDINARY / slots_clean_s:.0f}, "
        f"{-100 * drop:+.1f} %, target >= -5 %: {'met' if drop <= 0.05 else 'MISSED'})"
        f"  clean again {clean_s:5.2f} s, +8 pathological {hostile_s:5.2f} s (+{extra:.2f} s, rounds "
        f"{'/'.join(f'+{t - clean_s:.2f}' for t in took['hostile'])}, target <= {TIMEOUT_S + 1:g}: "
        f"{'met' if extra <= TIMEOUT_S + 1 else 'MISSED'}; the 512 done at {last_ordinary:.2f} s;"
        f" slot-per-item design {slots_s:5.2f} s)  pathological: {'/'.join(bad)}"
        f"  ordinary items moved {sum(moved)} of {len(moved) * ORDINARY}"
        f"  pool RSS {memory_before / 2**20:.0f} -> {memory_after / 2**20:.0f} MiB"
    )


def main_line() -> str:
    """The bench line, measured under the math env's python."""
    from bench.math_throughput import in_math_env

    return in_math_env("bench.hostile_math", _measure)


if __name__ == "__main__":
    print(main_line())
