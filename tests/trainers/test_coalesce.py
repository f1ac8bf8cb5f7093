"""Per-item coroutine calls coalesced into batches: own rows back, bounded size, shared typed failure."""

from __future__ import annotations

import asyncio
import threading

import pytest

from supervisor import LocalRewardBackend, ScorerRequestError
from supervisor.adapters.verl import VerlComputeScore
from supervisor.compose.coalesce import Coalescer


class Recorder:
    def __init__(self, fail_on: int | None = None) -> None:
        self.batches: list[list[int]] = []
        self.fail_on = fail_on

    async def __call__(self, rows: list[int]) -> list[str]:
        self.batches.append(list(rows))
        await asyncio.sleep(0)
        if self.fail_on is not None and self.fail_on in rows:
            raise ScorerRequestError(f"row {self.fail_on} is poison", kind="scorer_error")
        return [f"r{row}" for row in rows]


def gather(coalescer: Coalescer, rows: list[int]) -> list:
    async def run() -> list:
        return list(await asyncio.gather(*(coalescer(row) for row in rows), return_exceptions=True))

    return asyncio.run(run())


def test_concurrent_calls_become_one_batch_and_each_gets_its_own_row():
    recorder = Recorder()
    coalescer = Coalescer(recorder, max_batch=64, max_wait_s=0.05)
    rows = list(range(10))
    assert gather(coalescer, rows) == [f"r{row}" for row in rows]
    assert recorder.batches == [rows] and list(coalescer.batch_sizes) == [10]


def test_a_full_batch_is_sent_without_waiting_and_batches_are_bounded():
    recorder = Recorder()
    coalescer = Coalescer(recorder, max_batch=4, max_wait_s=30.0)  # only the size can release the first two
    results = gather(coalescer, list(range(8)))
    assert results == [f"r{row}" for row in range(8)]
    assert recorder.batches == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_the_wait_bound_releases_a_partial_batch():
    recorder = Recorder()
    coalescer = Coalescer(recorder, max_batch=100, max_wait_s=0.01)

    async def run() -> str:
        return await asyncio.wait_for(coalescer(5), timeout=10)  # a bound that never fires would hang here

    assert asyncio.run(run()) == "r5" and recorder.batches == [[5]]


def test_a_failed_batch_fails_every_caller_in_it_and_only_those():
    recorder = Recorder(fail_on=2)
    coalescer = Coalescer(recorder, max_batch=3, max_wait_s=0.05)
    results = gather(coalescer, list(range(6)))
    assert recorder.batches == [[0, 1, 2], [3, 4, 5]]
    assert all(isinstance(r, ScorerRequestError) and "row 2 is poison" in str(r) for r in results[:3])
    assert results[3:] == ["r3", "r4", "r5"]


def test_a_cancelled_caller_leaves_the_rest_of_its_batch_alone():
    recorder = Recorder()
    coalescer = Coalescer(recorder, max_batch=64, max_wait_s=0.05)

    async def run() -> list:
        tasks = [asyncio.ensure_future(coalescer(row)) for row in range(4)]
        await asyncio.sleep(0)
        tasks[1].cancel()
        return list(await asyncio.gather(*tasks, return_exceptions=True))

    results = asyncio.run(run())
    assert isinstance(results[1], asyncio.CancelledError)
    assert [results[0], results[2], results[3]] == ["r0", "r2", "r3"]


def test_callers_on_different_event_loops_never_share_a_batch():
    recorder = Recorder()
    coalescer = Coalescer(recorder, max_batch=64, max_wait_s=1.0)
    out: dict[int, list] = {}
    both_waiting = threading.Barrier(2)

    async def rows(base: int) -> list:
        calls = [asyncio.ensure_future(coalescer(row)) for row in (base, base + 1)]
        await asyncio.sleep(0)  # both rows are pending in this loop's batch...
        await asyncio.to_thread(both_waiting.wait, 10)  # ...while the other loop's are pending in its own
        return list(await asyncio.gather(*calls))

    threads = [
        threading.Thread(target=lambda base=base: out.__setitem__(base, asyncio.run(rows(base)))) for base in (0, 100)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert out == {0: ["r0", "r1"], 100: ["r100", "r101"]}
    assert sorted(recorder.batches) == [[0, 1], [100, 101]]


def test_bad_bounds_are_refused():
    with pytest.raises(ValueError, match="max_batch"):
        Coalescer(Recorder(), max_batch=0)


def test_verl_async_calls_are_coalesced_into_one_request_per_burst(managed, trainer_python):
    backend = managed(trainer_python, "exact_match", "text")
    compute_score = VerlComputeScore(backend, max_wait_s=0.05)
    solutions = [str(i % 3) for i in range(24)]

    async def burst(score) -> list[dict]:
        return list(
            await asyncio.gather(
                *(score.acompute_score("gsm8k", s, "1", {"index": i}) for i, s in enumerate(solutions))
            )
        )

    results = asyncio.run(burst(compute_score))
    assert [r["score"] for r in results] == [1.0 if s == "1" else 0.0 for s in solutions]
    assert compute_score.coalescer is not None and list(compute_score.coalescer.batch_sizes) == [24]
    one_each = VerlComputeScore(backend, coalesce=False)
    assert asyncio.run(burst(one_each)) == results and one_each.coalescer is None


def test_verl_coalesced_scorer_failure_reaches_every_caller_of_the_batch():
    with LocalRewardBackend("exact_match") as backend:
        compute_score = VerlComputeScore(backend, max_wait_s=0.05)

        async def burst() -> list:
            calls = [compute_score.acompute_score("d", "x", "x", {"index": 1}) for _ in range(2)]
            calls.append(compute_score.acompute_score("d", "x", {"not": "a string"}))
            return list(await asyncio.gather(*calls, return_exceptions=True))

        results = asyncio.run(burst())
        assert compute_score.coalescer is not None and list(compute_score.coalescer.batch_sizes) == [3]
        assert all(isinstance(r, ScorerRequestError) for r in results), results
        assert len({id(r) for r in results}) == 1  # the batch's one typed error, handed to each caller
