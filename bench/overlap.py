"""Scoring that overlaps generation, for rollouts that finish one by one, in two regimes, one run.

`python -m bench.overlap`: 128 math completions (groups of 8) graded by a managed math_verify child
(`jobs: 2`). Each completion finishes at its own time, drawn once from a fixed seed (a vLLM engine
hands them over one by one); "generation" ends with the last one. Two regimes, scaled to the reward
time R measured first in the same run: generation-bound (generation lasts 3 R) and scorer-bound
(generation lasts R / 2). For each, four ways, interleaved:

- serial: wait for the last completion, then score the shard (the baseline);
- micros: 4 micro-batches of 32 in completion order, each sent when its last item is done
  (`score_while_generating`'s driver);
- stream: each item added to `backend.stream()` when it finishes, collected at the barrier;
- bound: what a perfect schedule reaches, scoring each item the moment it finishes at the
  scorer's full throughput: max(generation end + R / 128, first completion + R).

Reported per regime: the share of R hidden, (serial - way) / R, and the stream's time over the
bound. Targets (issue 29): at least 90 % hidden when generation dominates; within 10 % of the bound
when the scorer does.
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable

from bench.workloads import grpo_request
from supervisor import RewardItem, RewardRequest, micro_batches, score_while_generating

SEED = 29
MICRO = 32
REGIMES = {"generation-bound": 3.0, "scorer-bound": 0.5}  # generation length / reward time


def finish_times(count: int, length_s: float, seed: int = SEED) -> list[float]:
    """Completion times in [0, length_s], the last one at length_s: sorted uniform draws (each
    rollout's length is its own), from a fixed seed."""
    rng = random.Random(seed)
    draws = sorted(rng.random() for _ in range(count))
    return [length_s * draw / draws[-1] for draw in draws]


def at(started: float, offset_s: float) -> None:
    time.sleep(max(started + offset_s - time.perf_counter(), 0.0))


def ways(
    backend: object, items: list[RewardItem], times: list[float], micro: int = MICRO
) -> dict[str, Callable[[], object]]:
    """Each way of scoring the shard while it is generated; every call returns when all are
    scored. `micro`: the micro-batch driver's batch size."""
    micros = micro_batches(items, micro, lambda item: item.group_id)
    ends = [times[len([i for m in micros[: k + 1] for i in m]) - 1] for k in range(len(micros))]

    def serial() -> object:
        at(time.perf_counter(), times[-1])
        return backend.compute_rewards(RewardRequest(items=items, group_size=8))  # type: ignore[attr-defined]

    def micro_driver() -> object:
        started = time.perf_counter()
        pending = iter(ends)

        def generate(batch: list[RewardItem]) -> list[RewardItem]:
            at(started, next(pending))
            return batch

        return score_while_generating(backend, micros, generate, group_size=8)  # type: ignore[arg-type]

    def streamed() -> object:
        started = time.perf_counter()
        with backend.stream() as stream:  # type: ignore[attr-defined]
            for item, offset in zip(items, times, strict=True):
                at(started, offset)
                stream.add(item)
            return stream.results()

    return {"serial": serial, "micros": micro_driver, "stream": streamed}


def regime_line(
    backend: object,
    items: list[RewardItem],
    reward_s: float,
    factor: float,
    rounds: int,
    micro: int = MICRO,
) -> str:
    times = finish_times(len(items), factor * reward_s)
    calls = ways(backend, items, times, micro)
    samples: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(rounds):
        for name, call in calls.items():
            started = time.perf_counter()
            call()
            samples[name].append(time.perf_counter() - started)
    serial, micros, streamed = (
        statistics.median(samples[k]) for k in ("serial", "micros", "stream")
    )
    bound = max(times[-1] + reward_s / len(items), times[0] + reward_s)
    hidden = {
        name: (serial - value) / reward_s
        for name, value in (("micros", micros), ("stream", streamed))
    }
    return (
        f"  {factor:.1f} R of generation: serial {serial * 1e3:6.0f} ms  micros "
        f"{micros * 1e3:6.0f} ms (hidden {hidden['micros']:5.1%})  stream "
        f"{streamed * 1e3:6.0f} ms (hidden {hidden['stream']:5.1%})  bound "
        f"{bound * 1e3:6.0f} ms  stream/bound {streamed / bound:5.3f}"
    )


def main_line(rounds: int = 3, items: int = 128, r_repeats: int = 5, micro: int = MICRO) -> str:
    """`items`: the shard (a multiple of the group, 8; two micro-batches or more from 2 `micro`);
    `r_repeats`: the calls R is the median of; `micro`: the micro-batch driver's size (a multiple
    of the group; the smoke run's: one group, so 16 items make two micro-batches)."""
    from bench.common import managed

    shard = grpo_request(items, 8).items
    # pointwise: the stream holds no group back
    backend = managed("math", "math_verify", "text", {"jobs": 2})
    try:
        whole = RewardRequest(items=shard, group_size=8)
        backend.compute_rewards(whole)  # warm
        reward_s = statistics.median(
            _timed(lambda: backend.compute_rewards(whole)) for _ in range(r_repeats)
        )
        lines = [
            f"overlap: {len(shard)} math items finishing one by one (seed {SEED}), reward alone "
            f"R = {reward_s * 1e3:.0f} ms"
        ]
        for name, factor in REGIMES.items():
            line = regime_line(backend, shard, reward_s, factor, rounds, micro)
            lines.append(f"{line}  [{name}]")
    finally:
        backend.close()
    return "\n".join(lines)


def _timed(call: Callable[[], object]) -> float:
    started = time.perf_counter()
    call()
    return time.perf_counter() - started


if __name__ == "__main__":
    print(main_line())
