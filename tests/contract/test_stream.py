"""Streaming scoring (`backend.stream()`): items added as they finish, coalesced windows, the step's
barrier in add order, whole groups held back, failures named at the barrier, bounded memory,
forks."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time

import pytest

from supervisor import (
    LocalRewardBackend,
    PanelTerm,
    RewardItem,
    RewardPanel,
    ScorerProcessDied,
    ScorerRequestError,
)
from supervisor.errors import ConfigError, ScorerError, ScorerItemsFailed
from supervisor.submit import SubmissionQueueFull
from tests.conftest import eventually, wait_until_gone

PROBE = "tests.helpers.fixture_scorers:Probe"  # reward = len(text)
SPY = "tests.helpers.fixture_scorers:GroupSpy"  # groupwise: reward = the size of the group it got


def item(name: str, text: str, group: str | None = None) -> RewardItem:
    return RewardItem(
        id=name, text=text, group_id=group, prompt=None if group is None else f"p-{group}"
    )


def test_items_added_one_by_one_come_back_in_add_order_from_coalesced_windows():
    with (
        LocalRewardBackend(PROBE, {"sleep_s": 0.05}) as backend,
        backend.stream(window=8, max_wait_s=0.005) as stream,
    ):
        rows = [stream.add(item(f"i{n}", "x" * (n % 7 + 1)))[0] for n in range(40)]
        response = stream.results()
    assert response.ids == [f"i{n}" for n in range(40)]
    assert response.rewards == [float(n % 7 + 1) for n in range(40)]
    # each item's own future, its own row
    assert [row.result(0).reward for row in rows] == response.rewards
    assert sum(stream.window_sizes) == 40 and max(stream.window_sizes) <= 8
    # coalesced: items that came while a window ran went together
    assert len(stream.window_sizes) < 40


def test_a_scorer_bound_stream_grows_its_windows_and_a_barrier_sends_the_rest_at_once():
    with LocalRewardBackend(PROBE, {"sleep_s": 0.2}) as backend:
        stream = backend.stream(window=64, max_wait_s=0.0)
        stream.add(item("first", "a"))
        # an idle scorer: sent at once
        assert eventually(lambda: list(stream.window_sizes) == [1], 5)
        stream.add([item(f"r{n}", "bb") for n in range(10)])  # arrive while the first window runs
        started = time.monotonic()
        response = stream.results()
        assert list(stream.window_sizes) == [1, 10] and time.monotonic() - started < 2
        assert response.rewards == [1.0] + [2.0] * 10
        again = stream.add(item("next-step", "ccc"))  # a stream outlives its barrier: the next step
        assert stream.results().ids == ["next-step"] and again[0].result(0).reward == 3.0
        stream.close()


def test_whole_groups_are_held_back_until_complete_and_an_incomplete_one_fails_at_the_barrier():
    with (
        RewardPanel([PanelTerm("size", LocalRewardBackend(SPY), component="group_size")]) as panel,
        panel.stream(group_size=3, window=3, max_wait_s=0.0) as stream,
    ):
        for n in range(3):  # interleaved: two groups finish out of order
            stream.add([item(f"a{n}", "x", "a"), item(f"b{n}", "x", "b")])
        response = stream.results()
        assert (
            response.ids == ["a0", "b0", "a1", "b1", "a2", "b2"] and response.rewards == [3.0] * 6
        )
        assert list(stream.window_sizes) == [3, 3]  # each window one whole group
        stream.add([item("c0", "x", "c"), item("c1", "x", "c")])
        with pytest.raises(ScorerRequestError, match="groups incomplete.*'c': 2"):
            stream.results()
        with pytest.raises(ScorerRequestError, match="has no group_id"):
            stream.add(item("loose", "x"))
    with (
        LocalRewardBackend(SPY) as groupwise,
        pytest.raises(ConfigError, match="give the stream group_size"),
    ):
        groupwise.stream()


def test_a_failed_window_fails_only_its_items_named_at_the_barrier():
    with LocalRewardBackend("tests.helpers.fixture_scorers:Flaky") as backend:
        stream = backend.stream(window=2, max_wait_s=0.0)
        stream.add([item("ok0", "fine"), item("ok1", "fine")])
        assert eventually(lambda: len(stream.window_sizes) == 1, 5)
        stream.flush()
        doomed = stream.add([item("bad0", "raise"), item("bad1", "fine")])
        later = stream.add([item("ok2", "fine")])
        with pytest.raises(ScorerItemsFailed, match="2 of 5 items were not scored") as info:
            stream.results()
        assert (
            set(info.value.failed) == {"bad0", "bad1"}
            and "scorer bug on cue" in info.value.failed["bad0"]
        )
        assert info.value.partial is not None and info.value.partial.ids == ["ok0", "ok1", "ok2"]
        with pytest.raises(ScorerRequestError, match="scorer bug on cue"):
            doomed[0].result(0)
        assert later[0].result(0).reward is not None
        stream.close()


def test_a_producer_faster_than_the_scorer_waits_for_room_and_memory_stays_bounded():
    with LocalRewardBackend(PROBE, {"sleep_s": 0.05}) as backend:
        stream = backend.stream(window=4, max_wait_s=0.0, max_pending=8)
        peak = 0
        for n in range(40):
            stream.add(item(f"i{n}", "x"))
            peak = max(peak, stream._pending)
        assert peak <= 8  # never more unscored items than the bound, whatever the producer's pace
        assert stream.results().rewards == [1.0] * 40
        stream.close()
        slow = LocalRewardBackend(PROBE, {"sleep_s": 1.0})
        full = slow.stream(window=1, max_wait_s=0.0, max_pending=1, max_block_s=0.2)
        full.add(item("busy", "x"))
        with pytest.raises(SubmissionQueueFull, match="still unscored after"):
            full.add(item("no-room", "x"))
        full.close()
        slow.close()


def test_a_stream_used_in_a_fork_raises_backend_not_owned():
    with LocalRewardBackend(PROBE) as backend, backend.stream() as stream:
        stream.add(item("parent", "ab"))
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:  # the fork: report, then leave without running the parent's at-exit code
            try:
                stream.add(item("fork", "abc"))
                outcome = "accepted"
            except BaseException as exc:  # noqa: BLE001 - reported to the parent, which asserts on it
                outcome = type(exc).__name__
            os.write(write_end, outcome.encode())
            os._exit(0)
        os.close(write_end)
        os.waitpid(pid, 0)
        outcome = os.read(read_end, 4096).decode()
        os.close(read_end)
        assert outcome == "BackendNotOwned"
        assert stream.results().rewards == [2.0]  # the parent's stream is untouched


def test_async_callers_await_their_own_item_from_any_event_loop():
    with LocalRewardBackend(PROBE) as backend:
        stream = backend.stream(window=16, max_wait_s=0.005, collect=False)

        async def one(n: int) -> float:
            (row,) = stream.add(item(f"i{n}", "x" * n))
            return (await asyncio.wrap_future(row)).reward

        async def many() -> list[float]:
            return list(await asyncio.gather(*(one(n) for n in range(1, 21))))

        assert asyncio.run(many()) == [float(n) for n in range(1, 21)]
        results: list[float] = []
        thread = threading.Thread(target=lambda: results.extend(asyncio.run(many())))
        thread.start()
        thread.join(10)
        # another thread's loop: nothing shared to wait on
        assert results == [float(n) for n in range(1, 21)]

        async def cancelled() -> list:
            tasks = [asyncio.ensure_future(one(n)) for n in range(1, 5)]
            await asyncio.sleep(0)
            tasks[1].cancel()  # its caller leaves: the others' window is untouched
            return list(await asyncio.gather(*tasks, return_exceptions=True))

        outcome = asyncio.run(cancelled())
        assert isinstance(outcome[1], asyncio.CancelledError) and [outcome[0], *outcome[2:]] == [
            1.0,
            3.0,
            4.0,
        ]
        with pytest.raises(RuntimeError, match="no barrier"):
            stream.results()
        stream.close()
        with pytest.raises(ScorerError, match="closed"):
            stream.add(item("late", "x"))


@pytest.mark.slow
def test_a_kill_mid_stream_fails_only_the_window_in_flight(managed, trainer_python):
    backend = managed(trainer_python, PROBE, params={"sleep_s": 1.0}, restart={"backoff_s": 0})
    stream = backend.stream(window=2, max_wait_s=0.0)
    stream.add([item("a0", "x"), item("a1", "xx")])
    assert eventually(lambda: backend.health()["in_flight"] > 0, 10)
    stream.add([item("b0", "yyy"), item("b1", "yyyy")])  # waits while the first window runs
    doomed = backend.pid
    os.kill(doomed, signal.SIGKILL)
    with pytest.raises(ScorerItemsFailed) as info:
        stream.results()
    assert set(info.value.failed) == {"a0", "a1"} and isinstance(
        info.value.__cause__, ScorerProcessDied
    )
    # served by the restart
    assert info.value.partial is not None and info.value.partial.rewards == [3.0, 4.0]
    assert backend.pid != doomed and wait_until_gone([doomed], 5) == []
    stream.close()


def test_an_add_that_raises_takes_none_of_its_items_and_they_may_be_added_again():
    with (
        RewardPanel([PanelTerm("size", LocalRewardBackend(SPY), component="group_size")]) as panel,
        panel.stream(
            group_size=2, window=2, max_wait_s=0.0, max_pending=2, max_block_s=0.05
        ) as stream,
    ):
        # held until its group is complete: it never drains by itself
        stream.add(item("a0", "x", "a"))
        with pytest.raises(SubmissionQueueFull, match="1 items still unscored") as full:
            stream.add([item("c0", "x", "c"), item("c1", "x", "c")])  # no room in time
        with pytest.raises(ScorerRequestError, match=r"takes RewardItems: items\[1\] is a dict"):
            stream.add([item("c0", "x", "c"), {"id": "d", "text": "x"}])  # type: ignore[list-item]
        stream.max_block_s = 30.0  # the barrier's bound too: time for a window to be scored
        stream.add(item("a1", "x", "a"))
        assert stream.results().ids == ["a0", "a1"]  # only what was taken: no id of a refused add
        stream.add([item("c0", "x", "c"), item("c1", "x", "c")])  # a refused add's ids are free
        assert stream.results().rewards == [2.0, 2.0] and stream._pending == 0
    # the producer's own groups filled it, not the scorer
    assert "all held in incomplete groups" in str(full.value)


def test_a_grouped_add_refused_half_way_holds_nothing_back():
    with (
        RewardPanel([PanelTerm("size", LocalRewardBackend(SPY), component="group_size")]) as panel,
        panel.stream(group_size=2, window=2, max_wait_s=0.0) as stream,
    ):
        stream.add(item("a0", "x", "a"))
        with pytest.raises(ScorerRequestError, match="'loose' has no group_id"):
            stream.add([item("a1", "x", "a"), item("loose", "x")])
        with pytest.raises(ScorerRequestError, match="'a1' has a different prompt"):
            # its window would refuse it
            stream.add(RewardItem(id="a1", text="x", group_id="a", prompt="another"))
        with pytest.raises(ScorerRequestError, match="group 'a' would have 3 items, more than 2"):
            stream.add([item("a1", "x", "a"), item("a2", "x", "a")])
        assert stream._pending == 1  # a0 alone is held
        stream.add([item("a1", "x", "a"), item("b0", "x", "b"), item("b1", "x", "b")])
        with pytest.raises(ScorerRequestError, match="group 'b' is complete already"):
            stream.add(item("b2", "x", "b"))  # a group id is one group of a step
        response = stream.results()
        assert response.ids == ["a0", "a1", "b0", "b1"] and response.rewards == [2.0] * 4
        assert stream._pending == 0
        stream.add([item("b2", "x", "b"), item("b3", "x", "b")])  # the next step may use it again
        assert stream.results().rewards == [2.0, 2.0]


def test_ctrl_c_while_an_add_waits_for_room_takes_none_of_its_items():
    with LocalRewardBackend(PROBE, {"sleep_s": 0.3}) as backend:
        stream = backend.stream(window=1, max_wait_s=0.0, max_pending=1, max_block_s=30)
        stream.add(item("a", "x"))
        # a background shell ignores SIGINT
        previous = signal.signal(signal.SIGINT, signal.default_int_handler)
        ctrl_c = threading.Timer(
            0.05, signal.pthread_kill, (threading.main_thread().ident, signal.SIGINT)
        )
        try:
            ctrl_c.start()
            with pytest.raises(KeyboardInterrupt):
                stream.add(item("b", "xx"))
        finally:
            ctrl_c.cancel()
            signal.signal(signal.SIGINT, previous)
        assert stream.results().ids == ["a"]
        stream.add(item("b", "xx"))
        assert stream.results().rewards == [2.0] and stream._pending == 0
        stream.close()


class InterruptedSubmit(LocalRewardBackend):
    """Ctrl-C lands in the next submit (as it may in a trainer's flush)."""

    interrupt_next = False

    def submit(self, request):  # type: ignore[no-untyped-def]
        if self.interrupt_next:
            self.interrupt_next = False
            raise KeyboardInterrupt
        return super().submit(request)


def test_a_flush_interrupted_fails_the_windows_it_did_not_send_and_the_barrier_does_not_wait():
    with InterruptedSubmit(PROBE) as backend:
        # only a flush cuts
        stream = backend.stream(window=4, max_wait_s=float("inf"), max_block_s=2)
        stream.add([item("a", "x"), item("b", "xx")])
        backend.interrupt_next = True
        with pytest.raises(KeyboardInterrupt):
            stream.flush()  # its window's send is interrupted
        with pytest.raises(ScorerItemsFailed, match="interrupted before it was sent") as info:
            stream.results()
        assert set(info.value.failed) == {"a", "b"} and stream._pending == 0
        stream.add(item("c", "xxx"))
        assert stream.results().rewards == [3.0]
        stream.close()


def test_a_declared_group_size_keeps_groups_whole_over_any_backend():
    with (
        LocalRewardBackend(PROBE) as backend,
        backend.stream(group_size=2, window=3, max_wait_s=0.0) as stream,
    ):
        stream.add([item(f"{group}{n}", "x", group) for group in "abc" for n in range(2)])
        # its windows declare the size
        assert stream.results().ids == ["a0", "a1", "b0", "b1", "c0", "c1"]
        assert all(size % 2 == 0 for size in stream.window_sizes)
        with pytest.raises(ValueError, match="less than a group"):
            backend.stream(group_size=8, window=4, max_pending=4)
