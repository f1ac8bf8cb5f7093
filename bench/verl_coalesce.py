"""verl's async reward loop: one task per rollout, coalesced into one request vs one request each.

`python -m bench.verl_coalesce`: 256 concurrent `acompute_score` calls (math completions with
their golds) to the managed math_verify child, through `VerlComputeScore` with coalescing (the
default) and with `coalesce=False`. Same child, same run, rounds interleaved; the line reports
both p50s and their ratio.
"""

from __future__ import annotations

import asyncio
import statistics
import time

from bench.workloads import math_items
from supervisor.adapters.verl import VerlComputeScore

N = 256


def main_line(rounds: int = 5, n: int = N) -> str:
    from bench.common import managed

    rows = math_items(n)
    backend = managed("math", "math_verify", "text", {"jobs": 2})
    forms = {
        "coalesced": VerlComputeScore(backend),
        "per item": VerlComputeScore(backend, coalesce=False),
    }

    def burst(score: VerlComputeScore) -> None:
        async def run() -> None:
            await asyncio.gather(
                *(
                    score.acompute_score("math", r["text"], r["reference"], {"index": i})
                    for i, r in enumerate(rows)
                )
            )

        asyncio.run(run())

    samples: dict[str, list[float]] = {name: [] for name in forms}
    try:
        for form in forms.values():
            burst(form)  # warm
        for _ in range(rounds):
            for name, form in forms.items():
                started = time.perf_counter()
                burst(form)
                samples[name].append(time.perf_counter() - started)
    finally:
        backend.close()
    coalesced, per_item = (statistics.median(samples[k]) for k in ("coalesced", "per item"))
    return (
        f"verl async compute_score, {n} concurrent items, math_verify: coalesced "
        f"{coalesced * 1e3:7.1f} ms  one request per item {per_item * 1e3:7.1f} ms  ratio "
        f"{coalesced / per_item:.3f}"
    )


if __name__ == "__main__":
    print(main_line())
