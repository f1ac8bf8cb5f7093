"""scorers.common.retry on a real clock: the bounds every retrying caller relies on. Its deadline
decisions ("would this pause reach the deadline?") are checked on a fake clock, where they are
exact: on a real one a loaded machine moves every reading taken around them."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import pytest

from scorers.common import retry as retry_module
from scorers.common.retry import Retry


class Flaky(Exception):
    pass


class Other(Exception):
    pass


def failing(times: int, value: str = "ok", error: type[Exception] = Flaky):
    """An attempt that fails `times` times, then returns `value`; it records when each try began."""
    began: list[float] = []

    def attempt() -> str:
        began.append(time.monotonic())
        if len(began) <= times:
            raise error(f"try {len(began)}")
        return value

    return attempt, began


def test_retries_until_a_try_succeeds_with_doubling_capped_pauses():
    attempt, began = failing(4)
    retrying = Retry(time.monotonic() + 5, 0.02, 0.05, retry_on=(Flaky,))
    assert retrying.call(attempt) == "ok"
    assert retrying.tries == 5 and retrying.gave_up is None
    gaps = [b - a for a, b in zip(began, began[1:], strict=False)]
    # doubled, then held at the cap
    for gap, pause in zip(gaps, (0.02, 0.04, 0.05, 0.05), strict=True):
        assert gap >= pause


class FakeClock:
    """The clock `scorers.common.retry` reads, moved only by the loop's own pauses."""

    def __init__(self) -> None:
        self.now = 100.0
        self.pauses: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.pauses.append(seconds)
        self.now += seconds

    async def async_sleep(self, seconds: float) -> None:
        self.sleep(seconds)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr(
        retry_module, "time", SimpleNamespace(monotonic=fake.monotonic, time=time.time)
    )
    monkeypatch.setattr(retry_module, "asyncio", SimpleNamespace(sleep=fake.async_sleep))
    return fake


def test_the_deadline_is_absolute_and_no_pause_reaches_it(clock):
    attempt, _ = failing(1000)
    start = clock.now
    retrying = Retry(start + 0.3, 0.05, 0.1, retry_on=(Flaky,), sleep=clock.sleep)
    with pytest.raises(Flaky) as info:
        retrying.call(attempt)
    assert retrying.gave_up == "deadline"
    assert str(info.value) == f"try {retrying.tries}"  # the last try's own error, as it was raised
    # tries at 0, 0.05, 0.15 and 0.25: the next pause (0.1) would reach the deadline, so it gave up
    # instead of sleeping past it
    assert clock.pauses == [0.05, 0.1, 0.1] and retrying.tries == 4 and clock.now < start + 0.3


def test_a_deadline_already_past_gives_one_try():
    attempt, _ = failing(1000)
    retrying = Retry(time.monotonic() - 1, 0.01, 0.01, retry_on=(Flaky,))
    with pytest.raises(Flaky):
        retrying.call(attempt)
    assert retrying.tries == 1 and retrying.gave_up == "deadline"


def test_max_tries_bounds_the_tries():
    attempt, began = failing(1000)
    retrying = Retry(time.monotonic() + 5, 0.001, 0.001, retry_on=(Flaky,), max_tries=3)
    with pytest.raises(Flaky, match="try 3"):
        retrying.call(attempt)
    assert len(began) == 3 and retrying.tries == 3 and retrying.gave_up == "tries"


def test_an_error_retry_if_refuses_is_raised_at_once():
    attempt, began = failing(1000)
    retrying = Retry(
        time.monotonic() + 5, 0.001, 0.001, retry_on=(Flaky,), retry_if=lambda exc: False
    )
    with pytest.raises(Flaky, match="try 1"):
        retrying.call(attempt)
    assert len(began) == 1 and retrying.gave_up == "refused"


def test_an_error_of_another_type_propagates_without_a_retry():
    attempt, began = failing(1000, error=Other)
    retrying = Retry(time.monotonic() + 5, 0.001, 0.001, retry_on=(Flaky,))
    with pytest.raises(Other):
        retrying.call(attempt)
    assert len(began) == 1 and retrying.gave_up is None


def test_go_on_false_stops_the_retries():
    attempt, began = failing(1000)
    alive = iter([True, True, False])
    retrying = Retry(
        time.monotonic() + 5, 0.001, 0.001, retry_on=(Flaky,), go_on=lambda: next(alive)
    )
    with pytest.raises(Flaky, match="try 3"):
        retrying.call(attempt)
    assert len(began) == 3 and retrying.gave_up == "stopped"


def test_an_asked_pause_is_honoured_but_capped():
    attempt, began = failing(2)
    retrying = Retry(
        time.monotonic() + 5, 0.001, 0.08, retry_on=(Flaky,), asked_pause=lambda exc: 10.0
    )
    assert retrying.call(attempt) == "ok"
    assert all(b - a >= 0.08 for a, b in zip(began, began[1:], strict=False))
    assert began[-1] - began[0] < 5  # the cap held: not the 10 s asked for


def test_on_retry_sees_each_retry_and_a_raising_sleep_ends_the_loop_unchained():
    attempt, _ = failing(1000)
    seen: list[tuple[str, int, float]] = []

    def sleep(seconds: float) -> None:
        if len(seen) == 2:
            raise Other("interrupted")
        time.sleep(seconds)

    retrying = Retry(
        time.monotonic() + 5,
        0.01,
        0.1,
        retry_on=(Flaky,),
        on_retry=lambda exc, tries, pause: seen.append((str(exc), tries, pause)),
        sleep=sleep,
    )
    with pytest.raises(Other) as info:
        retrying.call(attempt)
    assert seen == [("try 1", 1, 0.01), ("try 2", 2, 0.02)]
    assert info.value.__context__ is None  # not raised "during handling" of the try's error


def test_call_async_leaves_the_loop_free_while_it_pauses():
    attempt, began = failing(3)
    ticks: list[float] = []

    async def ticker() -> None:
        while len(ticks) < 1000:
            ticks.append(time.monotonic())
            await asyncio.sleep(0.005)

    async def run() -> str:
        task = asyncio.create_task(ticker())
        try:
            return await Retry(time.monotonic() + 5, 0.03, 0.05, retry_on=(Flaky,)).call_async(
                attempt
            )
        finally:
            task.cancel()

    assert asyncio.run(run()) == "ok"
    # the ticker ran in every pause (its 5 ms timer falls due before the pause's own, however late
    # the loop wakes): a pause that blocked the loop would have none
    pauses = zip(began, began[1:], strict=False)
    assert len(began) == 4 and all(any(a < tick < b for tick in ticks) for a, b in pauses), ticks


def test_call_async_gives_up_at_the_deadline_with_the_last_error(clock):
    attempt, _ = failing(1000)
    start = clock.now
    retrying = Retry(start + 0.2, 0.01, 0.05, retry_on=(Flaky,))
    with pytest.raises(Flaky, match=r"try 6$"):
        asyncio.run(retrying.call_async(attempt))
    assert retrying.gave_up == "deadline" and clock.now < start + 0.2
    # the next would reach 0.22
    assert clock.pauses == pytest.approx([0.01, 0.02, 0.04, 0.05, 0.05])


def test_bad_bounds_are_refused():
    for first, cap, tries in ((0, 1, None), (1, 0, None), (1, 1, 0)):
        with pytest.raises(ValueError):
            Retry(time.monotonic() + 1, first, cap, retry_on=(Flaky,), max_tries=tries)
