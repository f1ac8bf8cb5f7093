"""math_verify under hostile completions: 512 ordinary items plus 8 pathological ones, in one run.

`envs/math/.venv/bin/python -m bench.hostile_math` prints one line; `main_line()` returns it.

The pool is the one MathVerifyScorer runs (`jobs: 2`, `timeout_s: 5`, the same grade function,
preload, warm-up and `warm_replay`), driven directly so each item's completion time is known.
After each of its batches the bench waits, untimed, for the pool's template to replay part of
it (about 0.7 s of one core), as it would while a trainer generates the next rollouts. Every timed
batch holds 512 ordinary items no worker has graded before (a trainer never sends the same
completions twice; a repeated batch would be served partly from sympy's caches, and only by
the workers that saw it). Measured in one run, on warm workers, medians of interleaved rounds:
- ordinary throughput: a clean batch through our pool and the same batch through the
  slot-per-item design (`overflow: 0`: every slow item keeps its slot until its timeout, the
  design before the soft deadline), 8 rounds, alternating who goes first;
- the cost of pathological items: 5 rounds of a clean batch and a hostile one (another 512
  ordinary items with the 8 pathological ones spread through them at fixed positions), both
  through our pool, alternating which of the two slices is the hostile one;
- a hostile batch once through the slot-per-item design.
Targets: the hostile batch costs at most timeout_s + 1 s more than the clean one (the median
of the rounds' differences), and the throughput on ordinary items drops by at most 5 % against
the slot-per-item design (the median of the rounds' ratios). When the 512 ordinary items of
the hostile batch were all done, and how many ordinary items were moved to overflow, are
printed too. Verdicts on a hostile batch's ordinary items must equal the slot-per-item pool's
on the same items in every round; the pool's resident memory after a hostile batch is printed beside
its memory before (the highest of the rounds).
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from bench.common import PeakMemory
from bench.workloads import PATHOLOGICAL, slices, with_hazards

JOBS, TIMEOUT_S, ORDINARY = 2, 5.0, 512
CLEAN_ROUNDS, HOSTILE_ROUNDS = 8, 5


# `make bench --smoke` (and CI): every step and check of the line, on the smallest sizes
SMOKE: dict[str, Any] = {
    "ordinary": 16,
    "hazards": 1,
    "timeout_s": 1.0,
    "clean_rounds": 1,
    "hostile_rounds": 1,
    "managed_rounds": 1,
    "generation_s": 0.0,
    "peer_timeout_s": 1,
    "warm": 4,
    "together": True,
}


def pool_rss(pool) -> int:
    total = 0
    for pid in [*pool.worker_pids(), *filter(None, [pool.template_pid()])]:
        with open(f"/proc/{pid}/statm") as statm:
            total += int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    return total


def _measure(
    ordinary: int = ORDINARY,
    hazards: int = len(PATHOLOGICAL),
    timeout_s: float = TIMEOUT_S,
    clean_rounds: int = CLEAN_ROUNDS,
    hostile_rounds: int = HOSTILE_ROUNDS,
    peer_timeout_s: int = 5,
    warm: int = 64,
) -> str:
    from bench.common import workload
    from scorers.builtin.math_verify import DEFAULT_WARM_REPLAY
    from scorers.builtin.math_verify_boot import GRADE_FN, WARM_MODULE
    from scorers.grading.pool import GradingPool

    fresh = slices(ordinary)
    warmup = [(text, gold, 6, 15, True) for text, gold in workload(0, warm)]
    pools = {
        name: GradingPool(
            JOBS,
            timeout_s,
            GRADE_FN,
            preload=["math_verify", WARM_MODULE],
            overflow=overflow,
            warm_replay=replay,
        )
        for name, overflow, replay in (("ours", None, DEFAULT_WARM_REPLAY), ("slots", 0, 0))
    }

    def grade(name: str, tasks: list[tuple]) -> tuple[list, float]:
        """One timed batch; then, untimed, our template replays some of it (a trainer generates
        meanwhile)."""
        began = time.monotonic()
        graded = pools[name].grade(tasks)
        took_s = time.monotonic() - began
        if not pools[name].settle():
            raise AssertionError("the template did not finish its replay within 30 s")
        return graded, took_s

    try:
        for pool in pools.values():
            pool.start()
            pool.grade(warmup)
            pool.settle()
        ours, slots = pools["ours"], pools["slots"]
        took: dict[str, list[float]] = {"ours": [], "slots": [], "clean": [], "hostile": []}
        done_at: list[float] = []
        # ordinary items our pool moved to overflow (clean and hostile batches)
        moved: list[int] = []
        memory: list[tuple[int, int]] = []
        # one clean batch through both designs, alternating who goes first
        for round_ in range(clean_rounds):
            batch = next(fresh)
            for name in ("ours", "slots") if round_ % 2 == 0 else ("slots", "ours"):
                graded, took_s = grade(name, batch)
                took[name].append(took_s)
                if name == "ours":
                    moved.append(sum(o.overflowed for o in graded))
        # a clean and a hostile batch through ours, slices alternating
        for round_ in range(hostile_rounds):
            first, second = next(fresh), next(fresh)
            clean, beside = (first, second) if round_ % 2 == 0 else (second, first)
            hostile, kept = with_hazards(beside, hazards)
            graded, took_s = grade("ours", clean)
            moved.append(sum(o.overflowed for o in graded))
            took["clean"].append(took_s)
            before = pool_rss(ours)
            began = time.monotonic()
            outcomes, took_s = grade("ours", hostile)
            took["hostile"].append(took_s)
            done_at.append(max(outcomes[i].finished_at for i in kept) - began)
            memory.append((before, pool_rss(ours)))
            moved.append(sum(outcomes[i].overflowed for i in kept))
            if [outcomes[i].value for i in kept] != [o.value for o in slots.grade(beside)]:
                raise AssertionError(
                    "verdicts on the ordinary items changed next to the pathological ones"
                )
        ours_s, slots_clean_s = statistics.median(took["ours"]), statistics.median(took["slots"])
        clean_s, hostile_s = statistics.median(took["clean"]), statistics.median(took["hostile"])
        last_ordinary = statistics.median(done_at)
        memory_before, memory_after = max(b for b, _ in memory), max(a for _, a in memory)
        began = time.monotonic()
        slots.grade(with_hazards(next(fresh), hazards)[0])
        slots_s = time.monotonic() - began
    finally:
        for pool in pools.values():
            pool.close()
    in_process_s, in_process_peak = _in_the_main_thread(
        with_hazards(next(fresh), hazards)[0], peer_timeout_s
    )
    bad = sorted({o.status for i, o in enumerate(outcomes) if i not in kept})
    # ordinary throughput, ours against the slot-per-item design: the median of the rounds' own
    # ratios (the two batches of a round ran back to back, so they saw the machine at the same
    # speed)
    drops = [1 - s / o for o, s in zip(took["ours"], took["slots"], strict=True)]
    drop = statistics.median(drops)
    # each round's own clean batch
    extras = [h - c for h, c in zip(took["hostile"], took["clean"], strict=True)]
    extra = statistics.median(extras)
    return (
        f"hostile math ({JOBS} jobs, timeout {timeout_s:g} s)   clean {ordinary} items "
        f"{ours_s:5.2f} s ({ordinary / ours_s:.0f} items/s; slot-per-item design "
        f"{ordinary / slots_clean_s:.0f}, {-100 * drop:+.1f} %, median of rounds "
        f"{'/'.join(f'{-100 * d:+.0f}' for d in drops)}, target >= -5 %: "
        f"{'met' if drop <= 0.05 else 'MISSED'})  clean {clean_s:5.2f} s, +{hazards} "
        f"pathological {hostile_s:5.2f} s (+{extra:.2f} s, median of rounds "
        f"{'/'.join(f'{e:+.2f}' for e in extras)}, target <= {timeout_s + 1:g}: "
        f"{'met' if extra <= timeout_s + 1 else 'MISSED'}; the {ordinary} done at "
        f"{last_ordinary:.2f} s; slot-per-item design {slots_s:5.2f} s)  pathological: "
        f"{'/'.join(bad)}  ordinary items moved {sum(moved)} of {len(moved) * ordinary}  "
        f"pool RSS {memory_before / 2**20:.0f} -> {memory_after / 2**20:.0f} MiB  peer, "
        f"TRL's accuracy reward in the main thread (math_verify's own {peer_timeout_s} s "
        f"timeouts): hostile batch {in_process_s:5.2f} s, peak RSS "
        f"{in_process_peak / 2**30:.2f} GiB"
    )


def _in_the_main_thread(tasks: list[tuple], timeout_s: int = 5) -> tuple[float, int]:
    """The hostile batch graded as TRL's accuracy reward does (parse the gold, parse the completion,
    verify, in the trainer's main thread, math_verify's signal timeouts: 5 s, its default, but in a
    smoke run), in a fresh process of this env: (seconds, that process's peak RSS)."""
    import json
    import subprocess

    code = (
        "import json, resource, sys, time\n"
        "from math_verify import LatexExtractionConfig, parse, verify\n"
        "from latex2sympy2_extended import NormalizationConfig\n"
        "tasks = json.load(sys.stdin)\n"
        "answer = "
        "[LatexExtractionConfig(normalization_config=NormalizationConfig(nits=False, "
        "malformed_operators=False, basic_latex=True, boxed='all', units=True), "
        "boxed_match_priority=0, try_extract_without_anchor=False)]\nbegan = "
        "time.monotonic()\nfor text, gold in tasks:\n    gold_parsed = parse(gold, "
        "extraction_mode='first_match')\n"
        f"    verify(gold_parsed, parse(text, extraction_config=answer, "
        f"extraction_mode='first_match', parsing_timeout={timeout_s}), "
        f"timeout_seconds={timeout_s})\n"
        "print(json.dumps([time.monotonic() - began, "
        "resource.getrusage(resource.RUSAGE_SELF).ru_maxrss]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        input=json.dumps([[t[0], t[1]] for t in tasks]),
        capture_output=True,
        text=True,
        timeout=600,
    )
    if done.returncode != 0:
        raise RuntimeError(f"the in-process peer failed: {done.stderr[-2000:]}")
    seconds, peak_kib = json.loads(done.stdout.splitlines()[-1])
    return seconds, peak_kib << 10


MANAGED_ROUNDS = 3
GENERATION_S = 1.5  # between calls, as a trainer generates: the child's template replays meanwhile


def _through_managed(
    ordinary: int = ORDINARY,
    hazards: int = len(PATHOLOGICAL),
    timeout_s: float = TIMEOUT_S,
    managed_rounds: int = MANAGED_ROUNDS,
    generation_s: float = GENERATION_S,
) -> str:
    """The same workload through a managed math_verify child with the default client config
    (`request_batch_size` 64: the 520 items go as 9 chunks), clean and hostile calls interleaved."""
    from bench.common import MATH_PYTHON
    from supervisor import ManagedScorerProcessBackend, RewardItem, RewardRequest

    spec = {
        "process": {"python_executable": str(MATH_PYTHON)},
        "scorer": {"name": "math_verify", "params": {"jobs": JOBS, "timeout_s": timeout_s}},
        "client": {"input_kind": "text"},
    }
    fresh = slices(ordinary)

    def request(tasks: list[tuple]) -> RewardRequest:
        return RewardRequest(
            items=[RewardItem(id=str(i), text=t[0], reference=t[1]) for i, t in enumerate(tasks)]
        )

    with ManagedScorerProcessBackend(spec) as backend:
        backend.compute_rewards(request(next(fresh)))
        extras, cleans, peaks = [], [], []
        assert backend.pid is not None
        for round_ in range(managed_rounds):
            first, second = next(fresh), next(fresh)
            clean, beside = (first, second) if round_ % 2 == 0 else (second, first)
            took = {}
            for name, tasks in (("clean", clean), ("hostile", with_hazards(beside, hazards)[0])):
                time.sleep(generation_s)
                began = time.monotonic()
                with PeakMemory(backend.pid) as memory:
                    backend.compute_rewards(request(tasks))
                took[name] = time.monotonic() - began
                if name == "hostile":
                    peaks.append(memory)
            extras.append(took["hostile"] - took["clean"])
            cleans.append(took["clean"])
        chunks = -(-(ordinary + hazards) // backend.spec.client.request_batch_size)
    extra = statistics.median(extras)
    return (
        f"  through a managed child (default client config: {chunks} chunks of "
        f"{backend.spec.client.request_batch_size}): clean {statistics.median(cleans):5.2f} "
        f"s, +{hazards} pathological +{extra:.2f} s (median of rounds "
        f"{'/'.join(f'{e:+.2f}' for e in extras)}, target <= {timeout_s + 1:g}: "
        f"{'met' if extra <= timeout_s + 1 else 'MISSED'}); the child's process tree during "
        f"a hostile call: peak PSS {max(p.peak_pss for p in peaks) / 2**30:.2f} GiB (summed "
        f"RSS {max(p.peak_rss for p in peaks) / 2**30:.2f})"
    )


def main_line(
    ordinary: int = ORDINARY,
    hazards: int = len(PATHOLOGICAL),
    timeout_s: float = TIMEOUT_S,
    clean_rounds: int = CLEAN_ROUNDS,
    hostile_rounds: int = HOSTILE_ROUNDS,
    managed_rounds: int = MANAGED_ROUNDS,
    generation_s: float = GENERATION_S,
    peer_timeout_s: int = 5,
    warm: int = 64,
    together: bool = False,
) -> str:
    """The bench line: the pool measured under the math env's python, then (from the trainer's env)
    a managed child. The defaults are the bench's; `SMOKE` the smallest sizes, where `together`
    runs the two parts at once (each then counts the other's load; the verdicts are still
    compared)."""
    from bench.common import MATH_PYTHON, both, in_math_env

    sizes: dict[str, Any] = {"ordinary": ordinary, "hazards": hazards, "timeout_s": timeout_s}

    def pool_part() -> str:
        return in_math_env(
            "bench.hostile_math",
            _measure,
            **sizes,
            clean_rounds=clean_rounds,
            hostile_rounds=hostile_rounds,
            peer_timeout_s=peer_timeout_s,
            warm=warm,
        )

    if Path(sys.prefix).resolve() == MATH_PYTHON.parent.parent.resolve():
        return pool_part()  # the math env runs only the pool part, for the trainer env's main_line
    pool_line, managed_line = both(
        pool_part,
        lambda: _through_managed(**sizes, managed_rounds=managed_rounds, generation_s=generation_s),
        together,
    )
    return pool_line + managed_line


if __name__ == "__main__":
    from bench.common import sizes_of_argv

    print(main_line(**sizes_of_argv()))
