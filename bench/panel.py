"""A GRPO step's reward panel: two managed terms scored concurrently vs one after the other.

`python -m bench.panel`: 128 math completions in groups of 8, `correct` (math_verify in the
math env) and `similar` (MiniLM text_similarity in the embed env). The same two children
score the same request as a panel (terms concurrently, from its threads) and as two calls in
a row; the ratio is measured in one run, rounds interleaved.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

from bench.workloads import grpo_request
from supervisor import PanelTerm, RewardPanel
from supervisor.backend import RewardBackend

ROUNDS = 7
ITEMS = 128


def main_line(rounds: int = ROUNDS, items: int = ITEMS) -> str:
    """`items`: the step's completions (a multiple of the group, 8)."""
    request = grpo_request(items)
    from bench.common import managed

    math = managed("math", "math_verify", "text", {"jobs": 1}, group_size=8)
    embed = managed("embed", "text_similarity", "text", {}, group_size=8)
    backends: list[RewardBackend] = [math, embed]
    try:
        panel = RewardPanel(
            [PanelTerm("correct", math), PanelTerm("similar", embed, weight=0.1, required=False)],
            owns_backends=False,
        )

        def sequential() -> None:
            for backend in backends:
                backend.compute_rewards(request)

        calls: dict[str, Callable[[], object]] = {
            "panel": lambda: panel.compute_rewards(request),
            "sequential": sequential,
        }
        samples: dict[str, list[float]] = {name: [] for name in calls}
        for call in calls.values():  # warm both paths
            call()
        for _ in range(rounds):  # interleaved: machine drift hits both alike
            for name, call in calls.items():
                started = time.perf_counter()
                call()
                samples[name].append(time.perf_counter() - started)
        response = panel.compute_rewards(request)
        assert response.component_rewards["correct"] == math.compute_rewards(request).rewards
    finally:
        for backend in backends:
            backend.close()
    panel_s, sequential_s = (statistics.median(samples[k]) for k in ("panel", "sequential"))
    return (
        f"{len(request.items)}-item GRPO panel (math_verify + text_similarity, 2 children) "
        f"p50 {panel_s * 1e3:8.2f} ms  terms one after the other {sequential_s * 1e3:8.2f} "
        f"ms  ratio {panel_s / sequential_s:5.3f}"
    )


if __name__ == "__main__":
    print(main_line())
