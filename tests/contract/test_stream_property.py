"""Property: `RewardStream.add` is all or nothing, whatever good and failing adds, windows that end
well or fail, and barriers are interleaved.

The stream runs over `Gated`, a backend whose windows end only when the test ends them, so the
stream's count of unscored items is known exactly at every step: the items taken and not yet ended.
A model of the step (ids taken in add order, open and completed groups, failed windows) says what
each call must do; after each call the stream's count equals the model's, never below zero nor
above `max_pending`, and each barrier returns exactly the ids of the adds that succeeded.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from supervisor import RewardItem, RewardRequest, RewardResponse, RewardStream, ScorerRequestError
from supervisor.errors import ScorerError, ScorerItemsFailed
from supervisor.submit import SubmissionQueueFull
from tests.conftest import eventually

SIZE, MAX_PENDING = 2, 6


class Gated:
    """A stream's backend (`supervisor.stream.Streamed`) whose windows end when `end` says."""

    group_size = None

    def __init__(self) -> None:
        self.windows: list[tuple[list[str], Future[RewardResponse]]] = []
        self._lock = threading.Lock()

    def needs_whole_groups(self) -> bool:
        return True

    def submit(self, request: RewardRequest) -> Future[RewardResponse]:
        future: Future[RewardResponse] = Future()
        with self._lock:
            self.windows.append((request.ids, future))
        return future

    def unended(self) -> list[tuple[list[str], Future[RewardResponse]]]:
        with self._lock:
            return [(ids, future) for ids, future in self.windows if not future.done()]

    @staticmethod
    def end(ids: list[str], future: Future[RewardResponse], ok: bool) -> None:
        if ok:
            future.set_result(
                RewardResponse(
                    ids=ids, rewards=[1.0] * len(ids), component_rewards={"one": [1.0] * len(ids)}
                )
            )
        else:
            future.set_exception(ScorerError(f"window {ids} refused"))


@dataclass
class Model:
    """What the stream holds, by the test's own count."""

    order: list[str] = field(default_factory=list)  # ids taken since the last barrier, in add order
    open: dict[str, list[str]] = field(default_factory=dict)  # group -> ids held
    complete: set[str] = field(default_factory=set)  # groups completed since the last barrier
    # ids of completed groups whose window has not ended
    unended: set[str] = field(default_factory=set)
    failed: set[str] = field(default_factory=set)  # ids whose window failed, since the last barrier
    pending: int = 0
    fresh: int = 0
    # ids of failed adds: never taken, free to add again
    retry: list[str] = field(default_factory=list)
    rows: list[Future[Any]] = field(default_factory=list)

    def new_id(self) -> str:
        self.fresh += 1
        return f"i{self.fresh}"

    def take(self, batch: list[RewardItem], rows: list[Future[Any]]) -> None:
        for item in batch:
            group = str(item.group_id)
            self.order.append(item.id)
            self.open.setdefault(group, []).append(item.id)
            if len(self.open[group]) == SIZE:
                self.unended.update(self.open.pop(group))
                self.complete.add(group)
            if item.id in self.retry:
                self.retry.remove(item.id)
        self.pending += len(batch)
        self.rows.extend(rows)


def grouped(name: str, group: str, prompt: str | None = None) -> RewardItem:
    return RewardItem(id=name, text="x", group_id=group, prompt=prompt or f"p-{group}")


def good_batch(data: st.DataObject, model: Model, least: int) -> list[RewardItem]:
    """Items that join open groups (never past their size) or new ones; ids fresh or of failed
    adds."""
    batch: list[RewardItem] = []
    room = {group: SIZE - len(ids) for group, ids in model.open.items()}
    for _ in range(data.draw(st.integers(least, 3))):
        choices = [group for group, left in room.items() if left > 0]
        group = data.draw(st.sampled_from([*choices, None]))
        if group is None:
            group = f"g{model.new_id()}"
            room[group] = SIZE
        room[group] -= 1
        reusable = [name for name in model.retry if name not in {item.id for item in batch}]
        name = (
            data.draw(st.sampled_from(reusable))
            if reusable and data.draw(st.booleans())
            else model.new_id()
        )
        batch.append(grouped(name, group))
    return batch


def poisoned(data: st.DataObject, model: Model) -> list[Any]:
    """A good batch with one thing `add` must refuse (before it takes anything)."""
    batch: list[Any] = good_batch(data, model, 0)
    kinds = [
        "loose",
        "alien",
        "prompt",
        "overflow",
        *(["dup"] if model.order else []),
        *(["reuse"] * bool(model.complete)),
    ]
    kind = data.draw(st.sampled_from(kinds))
    new_group = f"g{model.new_id()}"
    poison: list[Any] = {
        "loose": lambda: [RewardItem(id=model.new_id(), text="x")],
        "alien": lambda: [{"id": model.new_id(), "text": "x"}],
        "prompt": lambda: [
            grouped(model.new_id(), new_group),
            grouped(model.new_id(), new_group, "another prompt"),
        ],
        "overflow": lambda: [grouped(model.new_id(), new_group) for _ in range(SIZE + 1)],
        "dup": lambda: [grouped(data.draw(st.sampled_from(model.order)), new_group)],
        "reuse": lambda: [
            grouped(model.new_id(), data.draw(st.sampled_from(sorted(model.complete))))
        ],
    }[kind]()
    at = data.draw(st.integers(0, len(batch)))
    return batch[:at] + poison + batch[at:]


def end_windows(data: st.DataObject, stream: RewardStream, gate: Gated, model: Model) -> None:
    """Every complete group sent (flush), then each window ended well or failed."""
    stream.flush()
    sent = lambda: {name for ids, _ in gate.unended() for name in ids}  # noqa: E731
    assert eventually(lambda: sent() == model.unended, 5, every=0.001), (
        sent(),
        model.unended,
    )  # the worker may hold one cut
    for ids, future in gate.unended():
        ok = data.draw(st.booleans())
        gate.end(ids, future, ok)
        model.failed.update(() if ok else ids)
        model.pending -= len(ids)
    model.unended.clear()


def barrier(data: st.DataObject, stream: RewardStream, gate: Gated, model: Model) -> None:
    end_windows(data, stream, gate, model)
    failed = [name for name in model.order if name in model.failed]
    if model.open:
        with pytest.raises(ScorerRequestError, match="groups incomplete"):
            stream.results()
        # dropped: they fail, their room is back
        model.pending -= sum(len(ids) for ids in model.open.values())
    elif failed:
        with pytest.raises(ScorerItemsFailed) as info:
            stream.results()
        kept = [name for name in model.order if name not in model.failed]
        assert set(info.value.failed) == set(failed)
        assert (info.value.partial.ids if info.value.partial else []) == kept
    else:
        assert stream.results().ids == model.order
    model.order, model.open, model.complete, model.failed = [], {}, set(), set()


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_an_add_is_all_or_nothing_whatever_is_interleaved(data: st.DataObject) -> None:
    gate, model = Gated(), Model()
    stream = RewardStream(
        gate,
        group_size=SIZE,
        window=SIZE,
        max_wait_s=0.0,
        max_pending=MAX_PENDING,
        max_block_s=0.005,
    )
    for _ in range(data.draw(st.integers(1, 25))):
        step = data.draw(st.sampled_from(["good", "good", "bad", "end", "barrier"]))
        if step == "good":
            batch = good_batch(data, model, 1)
            # nothing ends by itself: no room
            if model.pending > 0 and model.pending + len(batch) > MAX_PENDING:
                with pytest.raises(SubmissionQueueFull):
                    stream.add(batch)
                model.retry.extend(item.id for item in batch if item.id not in model.retry)
            else:
                model.take(batch, stream.add(batch))
        elif step == "bad":
            batch = poisoned(data, model)
            with pytest.raises(ScorerRequestError):
                stream.add(batch)
            fresh = [
                item.id
                for item in batch
                if isinstance(item, RewardItem) and item.id not in model.order
            ]
            model.retry.extend(name for name in dict.fromkeys(fresh) if name not in model.retry)
        elif step == "end":
            end_windows(data, stream, gate, model)
        else:
            barrier(data, stream, gate, model)
        assert 0 <= stream._pending == model.pending <= MAX_PENDING
    stream.close()
    for ids, future in gate.unended():  # windows in flight end on their own after a close
        gate.end(ids, future, True)
    assert stream._pending == 0
    # every item taken was answered: scored, failed, or refused at close
    assert all(row.done() for row in model.rows)
