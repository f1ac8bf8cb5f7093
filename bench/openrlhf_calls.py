"""OpenRLHF's one-sample-per-call pattern: 256 concurrent `reward_func` calls from threads,
coalesced vs not.

`python -m bench.openrlhf_calls`: the file `managed-scorers integrations openrlhf` prints, loaded by
path as OpenRLHF 0.11.2 loads it, called 256 times at once through `asyncio.to_thread` (as its
`SingleTurnAgentExecutor` calls a reward function: one sample per call), over a managed
math_verify child (`jobs: 2`). Baseline: the same calls, each its own request to the same kind
of panel. p50 of 3 interleaved rounds; rewards asserted equal.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from child_runtime.protocol.openrlhf import response_of
from supervisor import RewardItem, RewardRequest, build_panels, load_recipe

CALLS = 256
ROUNDS = 3
PROMPT = "<|im_start|>user what is it?<|im_end|><|im_start|>assistant\n"
ROWS = [("so \\boxed{10\\%}", "0.1"), ("\\boxed{3}", "4"), ("the answer is $\\frac{1}{2}$", "0.5")]


def _rollouts(reward_func: Callable[..., dict[str, Any]], calls: int) -> tuple[float, list[float]]:
    rows = [ROWS[i % len(ROWS)] for i in range(calls)]

    async def at_once() -> list[dict[str, Any]]:
        return await asyncio.gather(
            *(
                asyncio.to_thread(reward_func, [PROMPT + t + "<|im_end|>"], [PROMPT], [g])
                for t, g in rows
            )
        )

    started = time.perf_counter()
    results = asyncio.run(at_once())
    return time.perf_counter() - started, [float(r["rewards"]) for r in results]


def main_line(calls: int = CALLS, rounds: int = ROUNDS) -> str:
    with tempfile.TemporaryDirectory() as folder:
        recipe = Path(folder) / "reward.yaml"
        math = {"backend": "managed", "scorer": "math_verify", "env": "math", "params": {"jobs": 2}}
        recipe.write_text(
            json.dumps(
                {
                    "reward": {
                        "models": {"math": math},
                        "reward_functions": {"correct": {"model": "math"}},
                    }
                }
            )
        )
        os.environ["MANAGED_SCORERS_RECIPE"] = str(recipe)
        spec = importlib.util.find_spec("supervisor.adapters.openrlhf")
        assert spec is not None and spec.origin is not None
        loaded = importlib.util.spec_from_file_location("reward_func", spec.origin)
        assert loaded is not None and loaded.loader is not None
        module = importlib.util.module_from_spec(loaded)
        loaded.loader.exec_module(module)
        plain, _ = build_panels(load_recipe(recipe))

        def one_request_each(
            queries: list[str], prompts: list[str], labels: list[str]
        ) -> dict[str, Any]:
            # what the reward_func file cuts, as it cuts it
            text = response_of(queries[0], prompts[0])
            item = RewardItem(
                id=f"s{time.perf_counter_ns()}-{os.getpid()}", text=text, reference=labels[0]
            )
            return {"rewards": plain.compute_rewards(RewardRequest(items=[item])).rewards[0]}

        try:
            # warm: both children booted
            _rollouts(module.reward_func, calls), _rollouts(one_request_each, calls)
            coalesced, alone = [], []
            for _ in range(rounds):
                took, ours = _rollouts(module.reward_func, calls)
                coalesced.append(took)
                took, theirs = _rollouts(one_request_each, calls)
                alone.append(took)
                assert ours == theirs, "coalesced and per-sample rewards differ"
            batches = list(module.scorer_for().stream.window_sizes)[-4:]
        finally:
            plain.close()
            module.scorer_for().close()
    c, a = statistics.median(coalesced), statistics.median(alone)
    return (
        f"OpenRLHF reward_func, {calls} concurrent one-sample calls, math_verify: coalesced "
        f"{c * 1e3:7.1f} ms  one request per sample {a * 1e3:7.1f} ms  ratio {c / a:.3f}  "
        f"(latest batches {batches})"
    )


if __name__ == "__main__":
    print(main_line())
