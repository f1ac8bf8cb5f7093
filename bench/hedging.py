"""The tail of a call over three servers when one stalls mid-call, hedged and not.

`python -m bench.hedging`: three judge servers (`serve --scorer llm_judge`, concurrency 4) asking
one fake OpenAI endpoint in this process that waits 100 ms before each verdict; a 32-item request
in groups of 8 (chunks of 8) through two MultiRemoteRewardBackends over the same servers, one with
`hedge: false`. Each round, interleaved, `calm` calls of each and then one during which the
stalling server, once it scores its share, is SIGSTOPped for `stall_s`, then SIGCONTed (a GC
pause, a preempted VM, a swapped host): a stall in one chunk of 16, a tail. Unhedged, that call
waits for the server; hedged, its chunk goes to another server past the p95 of what the backend
saw. Rewards asserted equal to one server's; the line prints each backend's p50 and max call
latency and the unhedged max over the hedged max.
"""

from __future__ import annotations

import signal
import statistics
import threading
import time
from typing import Any

from bench.common import judge_servers, judged_request
from bench.fake_openai import FakeOpenAI
from supervisor import MultiRemoteRewardBackend, RemoteRewardBackend, RewardRequest
from supervisor.compose.hedging import MIN_SAMPLES

TOKEN = "h" * 32
SMOKE = {"rounds": 1, "items": 16, "group": 2, "stall_s": 0.5, "warmup": 2, "calm": 0}


def stalled_call(
    backend: MultiRemoteRewardBackend,
    batch: RewardRequest,
    stalling: tuple[Any, RemoteRewardBackend],
    stall_s: float,
) -> tuple[float, list[float], bool]:
    """One call, the stalling server SIGSTOPped for `stall_s` once it scores (if it gets a share
    before the call ends): seconds, rewards, whether it was stalled."""
    process, health = stalling
    idle = time.perf_counter() + 30
    while health.health()["in_flight"] > 0 and time.perf_counter() < idle:
        time.sleep(0.01)  # what it still scores of the last call would be taken for this one's
    outcome: list[Any] = []

    def call() -> None:
        try:
            outcome.append(backend.compute_rewards(batch).rewards)
        except Exception as exc:  # noqa: BLE001 - raised below, in the bench's thread
            outcome.append(exc)
        outcome.append(time.perf_counter())  # the stall may outlast the call

    began = time.perf_counter()
    thread = threading.Thread(target=call, name="bench-hedged-call")
    thread.start()
    stalled = False
    while thread.is_alive() and not stalled and time.perf_counter() - began < 30:
        if health.health()["in_flight"] > 0:
            process.send_signal(signal.SIGSTOP)
            stalled = True
            time.sleep(stall_s)
            process.send_signal(signal.SIGCONT)
    thread.join(120)
    if thread.is_alive() or isinstance(outcome[0], Exception):
        raise RuntimeError(f"the call did not end well: {outcome}")
    return outcome[1] - began, outcome[0], stalled


def main_line(  # noqa: PLR0913 - the line's sizes, each one its smoke sets
    rounds: int = 5,
    items: int = 32,
    group: int = 8,
    stall_s: float = 2.0,
    warmup: int = 8,
    calm: int = 3,
) -> str:
    """`items`: a multiple of the `group` (a chunk), at least two groups; `warmup` calls of each
    backend first, at least MIN_SAMPLES chunks in all (the hedged one's p95 known)."""
    batch = judged_request(items, group, 0.1)
    calls: dict[str, list[float]] = {"unhedged": [], "hedged": []}
    stalls = 0
    with FakeOpenAI() as fake, judge_servers(3, fake.base_url, TOKEN) as made:
        urls = [url for _, url in made]
        options: dict[str, Any] = {"request_batch_size": group, "request_timeout": 60.0}
        with (
            RemoteRewardBackend(urls[0], TOKEN, request_batch_size=group) as one,
            RemoteRewardBackend(urls[1], TOKEN) as health,
            MultiRemoteRewardBackend(urls, TOKEN, hedge=False, **options) as unhedged,
            MultiRemoteRewardBackend(urls, TOKEN, **options) as hedged,
        ):
            expected = one.compute_rewards(batch).rewards
            backends = {"unhedged": unhedged, "hedged": hedged}
            assert warmup * (items // group) >= MIN_SAMPLES, "too few warm-up calls"
            for _ in range(warmup):
                for backend in backends.values():
                    assert backend.compute_rewards(batch).rewards == expected
            for _ in range(rounds):  # interleaved: machine drift hits both alike
                for name, backend in backends.items():
                    for _ in range(calm):
                        began = time.perf_counter()
                        assert backend.compute_rewards(batch).rewards == expected, name
                        calls[name].append(time.perf_counter() - began)
                    took, rewards, stalled = stalled_call(
                        backend, batch, (made[1][0], health), stall_s
                    )
                    assert rewards == expected, f"{name}: rewards differ from one server's"
                    calls[name].append(took)
                    stalls += stalled
            stats = hedged.stats()
    figures = "  ".join(
        f"{name} p50 {statistics.median(s) * 1e3:6.0f} ms max {max(s) * 1e3:6.0f} ms"
        for name, s in calls.items()
    )
    ratio = max(calls["unhedged"]) / max(calls["hedged"])
    return (
        f"{items}-item llm_judge over 3 servers, one SIGSTOPped {stall_s:g} s mid-call "
        f"in 1 call of {calm + 1} ({stalls}/{2 * rounds} stalled): {figures}  "
        f"max unhedged/hedged x{ratio:4.2f}  "
        f"hedges sent {stats['hedges_sent']} won {stats['hedges_won']} (delay "
        f"{stats['hedge_delay_s'] * 1e3:.0f} ms)"
    )


if __name__ == "__main__":
    print(main_line())
