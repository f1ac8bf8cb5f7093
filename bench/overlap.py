"""Scoring that overlaps generation vs scoring after generation, measured in one run.

`python -m bench.overlap`: a shard of 128 math completions in 4 micros (groups of 8); the
"generation" of a micro is a sleep of GENERATE_S (a GPU generating while the CPU is free).
After: generate every micro, then score the shard. Overlapped: `score_while_generating`
submits each micro to the managed math_verify child as soon as it exists. The line reports
the fraction of reward time hidden: (after - overlapped) / reward time alone.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

from bench.panel import grpo_request
from supervisor import RewardItem, RewardRequest, micro_batches, score_while_generating

GENERATE_S = 0.25
MICRO = 32


def main_line(rounds: int = 5) -> str:
    from bench.__main__ import managed  # bench.__main__ imports this module for its line list

    request = grpo_request(128, 8)
    micros = micro_batches(request.items, MICRO, lambda item: item.group_id)
    backend = managed("math", "math_verify", "text", {"jobs": 2}, group_size=8)

    def generate(micro: list[RewardItem]) -> list[RewardItem]:
        time.sleep(GENERATE_S)
        return micro

    def after() -> object:
        shard = [item for micro in micros for item in generate(micro)]
        return backend.compute_rewards(RewardRequest(items=shard, group_size=8))

    def overlapped() -> object:
        return score_while_generating(backend, micros, generate, group_size=8)

    def score_only() -> object:
        return backend.compute_rewards(request)

    calls: dict[str, Callable[[], object]] = {"after": after, "overlapped": overlapped, "score": score_only}
    samples: dict[str, list[float]] = {name: [] for name in calls}
    try:
        for call in calls.values():
            call()  # warm
        for _ in range(rounds):
            for name, call in calls.items():
                started = time.perf_counter()
                call()
                samples[name].append(time.perf_counter() - started)
    finally:
        backend.close()
    after_s, overlapped_s, score_s = (statistics.median(samples[k]) for k in ("after", "overlapped", "score"))
    hidden = (after_s - overlapped_s) / score_s
    return (
        f"overlap: {len(micros)} micros x {GENERATE_S * 1e3:.0f} ms generation + math_verify on 128 items: "
        f"after {after_s * 1e3:7.1f} ms  overlapped {overlapped_s * 1e3:7.1f} ms  reward alone {score_s * 1e3:7.1f} ms"
        f"  hidden {hidden:5.1%}"
    )


if __name__ == "__main__":
    print(main_line())
