"""Non-blocking scoring: submit() and its async form on every backend and panel, one request in
flight per child, and the micro-batch driver that scores while the next micro is generated."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

from supervisor import (
    LocalRewardBackend,
    PanelTerm,
    RewardItem,
    RewardPanel,
    RewardRequest,
    ScorerProcessDied,
    ScorerRequestError,
    ScorerUnavailable,
)
from supervisor.compose.overlap import OverlappedScoring, micro_batches, score_while_generating
from supervisor.submit import SubmissionQueueFull
from tests.conftest import eventually, wait_until_gone

PROBE = "tests.helpers.fixture_scorers:Probe"  # reward = len(text)


def texts(prefix: str, *values: str) -> RewardRequest:
    return RewardRequest(
        items=[RewardItem(id=f"{prefix}{i}", text=v) for i, v in enumerate(values)]
    )


def in_flight(backend) -> bool:
    return backend.health()["in_flight"] > 0


def test_back_to_back_submissions_attach_to_their_own_rows_and_a_kill_fails_only_the_one_sent(
    managed, trainer_python
):
    backend = managed(trainer_python, PROBE, params={"sleep_s": 1.0}, restart={"backoff_s": 0})
    first = backend.submit(texts("a", "x", "xx"))
    second = backend.submit(texts("b", "yyy", "yyyy", "yyyyy"))
    assert eventually(lambda: in_flight(backend), 10)  # the first is being scored, the second waits
    doomed = backend.pid
    os.kill(doomed, signal.SIGKILL)
    with pytest.raises(ScorerProcessDied) as info:
        first.result(30)
    assert info.value.pid == doomed
    response = second.result(30)  # never sent to the dead child: served by its replacement
    assert response.ids == ["b0", "b1", "b2"] and response.rewards == [3.0, 4.0, 5.0]
    assert backend.pid != doomed and wait_until_gone([doomed], 5) == []


def test_submissions_are_served_in_order_one_at_a_time(tmp_path):
    journal = str(tmp_path / "calls")
    with LocalRewardBackend(PROBE, {"journal": journal}) as backend:
        futures = [backend.submit(texts(f"r{n}-", "a" * n)) for n in range(5)]
        responses = [future.result(10) for future in futures]
    assert [r.rewards for r in responses] == [[float(n)] for n in range(5)]
    with open(journal) as handle:
        assert [line.split()[1] for line in handle.read().splitlines()] == [
            f"r{n}-0" for n in range(5)
        ]


def test_the_queue_is_bounded_and_close_fails_what_still_waits(managed, trainer_python):
    backend = managed(trainer_python, PROBE, params={"sleep_s": 2.0})
    backend.max_pending = 2
    running = backend.submit(texts("a", "x"))
    assert eventually(lambda: in_flight(backend), 10)
    waiting = [backend.submit(texts(f"w{n}", "y")) for n in range(2)]
    with pytest.raises(SubmissionQueueFull, match="2 submissions are already waiting"):
        backend.submit(texts("z", "z"))
    backend.close()
    for future in waiting:
        with pytest.raises(ScorerUnavailable, match="closed before this request was sent"):
            future.result(10)
    assert running.result(15).rewards == [1.0]  # the one in flight: a graceful close lets it finish
    with pytest.raises(ScorerUnavailable, match="closed"):
        backend.submit(texts("late", "x"))


def test_async_form_scores_concurrent_coroutines(managed, trainer_python):
    backend = managed(trainer_python, PROBE)

    async def main() -> list[list[float]]:
        responses = await asyncio.gather(
            *(backend.compute_rewards_async(texts(f"c{n}", "a" * n)) for n in range(4))
        )
        return [r.rewards for r in responses]

    assert asyncio.run(main()) == [[float(n)] for n in range(4)]


def test_async_callers_wait_for_room_in_a_full_queue_within_their_bound(managed, trainer_python):
    backend = managed(trainer_python, PROBE)
    backend.max_pending = 2

    async def burst(n: int) -> list[list[float]]:
        responses = await asyncio.gather(
            *(backend.compute_rewards_async(texts(f"q{k}", "a" * k)) for k in range(n))
        )
        return [r.rewards for r in responses]

    # 12 callers through a queue of 2
    assert asyncio.run(burst(12)) == [[float(k)] for k in range(12)]

    slow = managed(trainer_python, PROBE, params={"sleep_s": 1.0})
    slow.max_pending, slow.max_queue_wait_s = 1, 0.2

    async def overflow() -> list:
        calls = [slow.compute_rewards_async(texts(f"s{k}", "x")) for k in range(3)]
        return list(await asyncio.gather(*calls, return_exceptions=True))

    results = asyncio.run(overflow())  # one in flight, one waiting, the third gives up after 0.2 s
    assert [type(r).__name__ for r in results].count("SubmissionQueueFull") == 1, results
    assert [r.rewards for r in results if not isinstance(r, Exception)] == [[1.0], [1.0]]


def test_an_in_process_backend_submits_from_a_fork_with_a_submitter_of_its_own():
    """A local backend may be used in any process: a fork's submit gets its own worker (the parent's
    thread did not fork with it), never the parent's stale one, never a hang."""
    with LocalRewardBackend(PROBE) as backend:
        assert backend.submit(texts("parent", "ab")).result(10).rewards == [2.0]
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:  # the fork: report, then leave without running the parent's at-exit code
            try:
                outcome = str(backend.submit(texts("fork", "abc")).result(10).rewards)
            except BaseException as exc:  # noqa: BLE001 - reported to the parent, which asserts on it
                outcome = repr(exc)
            os.write(write_end, outcome.encode())
            os._exit(0)
        os.close(write_end)
        _, status = os.waitpid(pid, 0)
        outcome = os.read(read_end, 4096).decode()
        os.close(read_end)
        assert status == 0 and outcome == "[3.0]", outcome
        assert backend.submit(texts("parent-again", "a")).result(10).rewards == [1.0]


def test_a_panel_submits_too():
    with RewardPanel(
        [
            PanelTerm("len", LocalRewardBackend(PROBE)),
            PanelTerm("one", LocalRewardBackend("constant"), weight=2.0),
        ]
    ) as panel:
        response = panel.submit(texts("p", "abc")).result(10)
    assert response.rewards == [5.0]


# -- micro-batches ---------------------------------------------------------------------------------
def grouped(n_groups: int, size: int) -> list[RewardItem]:
    return [
        RewardItem(id=f"g{g}-{k}", group_id=f"g{g}", prompt=f"p{g}", text="x" * (g + 1))
        for g in range(n_groups)
        for k in range(size)
    ]


def test_micros_are_extended_to_the_end_of_their_last_group():
    items = grouped(4, 3)  # 12 rows, groups of 3
    micros = micro_batches(items, 4, lambda item: item.group_id)
    assert [[i.id for i in m] for m in micros] == [
        [f"g0-{k}" for k in range(3)] + [f"g1-{k}" for k in range(3)],
        [f"g2-{k}" for k in range(3)] + [f"g3-{k}" for k in range(3)],
    ]
    assert [len(m) for m in micro_batches(items, 1, lambda item: item.group_id)] == [3, 3, 3, 3]
    shuffled = [items[0], items[3], items[1]]
    with pytest.raises(ScorerRequestError, match="group 'g0' is not contiguous"):
        micro_batches(shuffled, 2, lambda item: item.group_id)


def test_each_micro_is_scored_while_the_next_is_generated(managed, trainer_python):
    backend = managed(trainer_python, PROBE, params={"sleep_s": 0.5})
    micros = micro_batches(grouped(4, 2), 2, lambda item: item.group_id)
    generated = []

    def generate(micro: list[RewardItem]) -> list[RewardItem]:
        if generated:  # the previous micro is being scored while this one is generated
            assert eventually(lambda: in_flight(backend), 10), "scoring did not overlap generation"
        generated.append(micro[0].group_id)
        return micro

    responses = score_while_generating(backend, micros, generate, group_size=2)
    assert [r.ids for r in responses] == [[i.id for i in m] for m in micros]
    assert [r.rewards for r in responses] == [[float(g + 1)] * 2 for g in range(4)]


def test_a_scorer_failure_raises_at_the_next_micro_boundary(managed, trainer_python):
    backend = managed(trainer_python, "tests.helpers.fixture_scorers:Flaky")
    with OverlappedScoring(backend) as stack:
        stack.add([RewardItem(id="m0", text="raise")])
        first = stack._futures[0]
        assert eventually(first.done, 10)
        with pytest.raises(ScorerRequestError, match="scorer bug on cue") as info:
            stack.add([RewardItem(id="m1", text="ok")])
    assert "while scoring micro-batch 0" in "".join(getattr(info.value, "__notes__", []))
    assert len(stack._futures) == 1  # the micro after the failure was never submitted
