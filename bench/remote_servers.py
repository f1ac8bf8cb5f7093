"""One remote term over 1, 2 and 4 `managed-scorers serve` servers of the LLM judge.

`python -m bench.remote_servers`: four judge servers (`serve --scorer llm_judge`, concurrency 4),
all asking one fake OpenAI endpoint in this process that waits 100 ms before each verdict. A
64-item request in groups of 8 (chunks of 8) goes to one server (RemoteRewardBackend) and to 2
and 4 of them (MultiRemoteRewardBackend); p50 of interleaved rounds, rewards asserted equal. The
judge waits rather than computes, so on a 2-core machine this measures the client's fan-out
(split, concurrent shares, join), not more compute.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

from bench.common import judge_servers, judged_request
from bench.fake_openai import FakeOpenAI
from supervisor import (
    MultiRemoteRewardBackend,
    RemoteRewardBackend,
    RewardBackend,
    RewardRequest,
)

ROUNDS = 3
TOKEN = "b" * 32
WAIT_S = 0.1
COUNTS = (1, 2, 4)


def request(n: int = 64, group: int = 8) -> RewardRequest:
    return judged_request(n, group, WAIT_S)


def _scoring(backend: RewardBackend, batch: RewardRequest) -> Callable[[], object]:
    return lambda: backend.compute_rewards(batch)


def main_line(rounds: int = ROUNDS, counts: tuple[int, ...] = COUNTS, items: int = 64) -> str:
    """`counts`: 1 first (the baseline); `items`: a multiple of the group (8)."""
    batch = request(items)
    with FakeOpenAI() as fake, judge_servers(max(counts), fake.base_url, TOKEN) as made:
        urls = [url for _, url in made]
        backends: dict[int, RewardBackend] = {
            1: RemoteRewardBackend(urls[0], TOKEN, request_batch_size=8)
        }
        try:
            for count in counts[1:]:
                backends[count] = MultiRemoteRewardBackend(
                    urls[:count], TOKEN, request_batch_size=8
                )
            calls = {n: _scoring(backend, batch) for n, backend in backends.items()}
            samples: dict[int, list[float]] = {n: [] for n in calls}
            # warm
            rewards = {n: backend.compute_rewards(batch).rewards for n, backend in backends.items()}
            assert all(r == rewards[1] for r in rewards.values()), "servers disagree"
            for _ in range(rounds):  # interleaved: machine drift hits every count alike
                for n, call in calls.items():
                    started = time.perf_counter()
                    call()
                    samples[n].append(time.perf_counter() - started)
        finally:
            for backend in backends.values():
                backend.close()
    p50 = {n: statistics.median(values) for n, values in samples.items()}
    figures = "  ".join(f"{n} server{'s' if n > 1 else ''} {p50[n] * 1e3:7.1f} ms" for n in counts)
    ratios = "  ".join(f"{n}: x{p50[1] / p50[n]:4.2f}" for n in counts[1:])
    return (
        f"{len(batch.items)}-item llm_judge over remote servers (fake OpenAI, "
        f"{WAIT_S * 1e3:.0f} ms per verdict) p50 {figures}  throughput vs 1 server {ratios}"
    )


if __name__ == "__main__":
    print(main_line())
