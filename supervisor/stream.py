"""Scoring items as they finish: a stream over any backend or panel.

Rollout engines hand completions over one by one (verl's agent loop, OpenRLHF's per-sample
executor, vLLM streaming). `RewardStream.add` takes them as they come; a worker thread cuts
them into windows and submits each to the backend while the rest generate. A window is cut when
`window` items are ready, or when the scorer is idle and the oldest ready item has waited
`max_wait_s`: while the scorer is busy the next window grows instead (a scorer-bound stream
coalesces into large calls by itself). When groups must stay whole (a groupwise term, a
declared `group_size`), a group's items are held back until it is complete.

`results()` is the step's barrier: every item added since the last barrier, in add order, as one
response; a failure raises there, naming the items it cost (only the failed windows' items: a
window that failed alone takes no other item with it). `add` returns one future per item (its
`ItemReward`) for callers that await items one by one (the verl and OpenRLHF adapters). Memory
is bounded: `add` waits (at most `max_block_s`) while `max_pending` items are unscored.

`add` is all or nothing: it checks everything (the items, their ids, their groups, room) before it
takes any of them, so an add that raises leaves the stream as it was and its items may be added
again. Every window that is cut is sent or fails (an interrupted flush fails what it did not send),
and every window that ends gives its room back, whatever its outcome.
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Protocol, Self

from scorers.diagnostics import merge_term_reports
from scorers.groups import GroupInputError, partition
from supervisor.errors import (
    BackendNotOwned,
    ConfigError,
    ScorerError,
    ScorerItemsFailed,
    ScorerRequestError,
)
from supervisor.joined import join_rows, rows_by_id, shares_failed
from supervisor.outcome import Outcome
from supervisor.submit import Submission, SubmissionQueueFull
from supervisor.types import RewardItem, RewardRequest, RewardResponse

WAKE_S = 0.5  # the worker's longest sleep without news (every change notifies it anyway)


class Streamed(Protocol):
    """What a stream needs of its backend (a RewardBackend, which makes streams of itself)."""

    def submit(self, request: RewardRequest) -> Future[RewardResponse]: ...


@dataclass(frozen=True)
class ItemReward:
    """One item's row of its window's response."""

    id: str
    reward: float
    components: dict[str, float | None]
    usable: bool  # whether a trainer may use the reward (RewardResponse.usable)
    error: str | None
    # what each scorer said of the item (RewardResponse.details_for): reporting only
    details: dict[str, Any] = field(default_factory=dict)


@dataclass
class _Window:
    items: list[RewardItem]
    rows: list[Future[ItemReward]]
    future: Future[RewardResponse] | None = None


@dataclass
class _Groups:
    """Items held back until their group is complete (group id -> items, futures)."""

    size: int
    open: dict[str, tuple[list[RewardItem], list[Future[ItemReward]]]] = field(default_factory=dict)


class RewardStream:
    """Add items as they finish; collect the step's rewards at `results()`. Made by
    `backend.stream()`."""

    def __init__(
        self,
        backend: Streamed,
        group_size: int | None = None,
        window: int = 64,
        max_wait_s: float = 0.01,
        max_pending: int = 4096,
        max_block_s: float = 600.0,
        collect: bool = True,
        whole_groups: bool = True,
    ) -> None:
        """`collect=False`: no barrier, items are only read through their futures (nothing is kept).
        `whole_groups`: the backend scores whole groups only, so the stream needs `group_size`."""
        _check_settings(
            backend, group_size, window, max_wait_s, max_pending, max_block_s, whole_groups
        )
        size = group_size
        self.backend, self.group_size, self.window, self.max_wait_s = (
            backend,
            size,
            window,
            max_wait_s,
        )
        self.max_pending, self.max_block_s, self.collect = max_pending, max_block_s, collect
        self._set_up_state()

    def _set_up_state(self) -> None:
        """The windows, groups and counters of an empty stream, and the lock that guards them."""
        # the latest windows cut, in order (tests, benches)
        self.window_sizes: deque[int] = deque(maxlen=1024)
        self._owner = os.getpid()
        self._cond = threading.Condition()
        # every window declares the size, so a backend refuses a window with part of a group: hold
        # them whole
        self._groups = _Groups(self.group_size) if self.group_size is not None else None
        self._ready: list[tuple[RewardItem, Future[ItemReward]]] = []
        self._ready_since: float | None = None  # when the oldest ready item became ready
        self._order: list[str] = []  # ids since the last barrier, in add order
        self._seen: set[str] = set()
        self._grouped: set[str] = set()  # groups completed since the last barrier (collect only)
        self._windows: list[_Window] = []  # sent since the last barrier (collect only)
        self._in_flight = 0
        self._pending = 0  # added, not yet scored
        self._barrier = False
        self._closed = False
        self._worker: threading.Thread | None = None

    # -- the producer's side ------------------------------------------------------------------
    def add(self, items: RewardItem | Sequence[RewardItem]) -> list[Future[ItemReward]]:
        """Items that finished; one future per item. Waits for room while `max_pending` are
        unscored. All or nothing: every check (and the wait for room) comes before the stream takes
        any item."""
        batch = _items_of(items)
        deadline = time.monotonic() + self.max_block_s
        self._check_owner()
        with self._cond:
            # checked again after each wait: other producers, or a barrier, may have come meanwhile
            while True:
                self._check_usable()
                self._check_new(batch)
                if self._pending == 0 or self._pending + len(batch) <= self.max_pending:
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    raise self._no_room()
                self._cond.wait(min(left, WAKE_S))
            # before anything is taken: a thread that cannot start leaves nothing behind
            self._start_worker()
            rows = self._take(batch)
            self._cond.notify_all()
        return rows

    def flush(self) -> list[Future[RewardResponse]]:
        """Send every ready item now, whatever the scorer is doing (a micro-batch boundary)."""
        self._check_owner()
        with self._cond:
            self._check_usable()
            cut = []
            while self._ready:
                cut.append(self._cut(len(self._ready)))
        return self._send_all(cut)

    def raise_if_failed(self) -> None:
        """Raise a window's failure already known (at a micro boundary: never later than the
        barrier)."""
        self._check_owner()
        with self._cond:
            windows = list(self._windows)
        for index, window in enumerate(windows):
            ended = window.future is not None and window.future.done()
            error = _outcome(window).error if ended else None
            if error is not None:
                error.add_note(f"while scoring stream window {index} ({len(window.items)} items)")
                raise error

    def results(self) -> RewardResponse:
        """The barrier: every item since the last one, in add order, once all are scored."""
        if not self.collect:
            raise RuntimeError(
                "a stream made with collect=False has no barrier: read each item's future"
            )
        try:
            windows, order, incomplete = self._drained()
        except BaseException:  # Ctrl-C while waiting (or a fork): nobody reads what is in flight
            if os.getpid() == self._owner:
                self.abandon()
            raise
        outcomes = [_outcome(window) for window in windows]
        if incomplete:
            raise ScorerRequestError(
                f"the stream's barrier came with groups incomplete (group id: items of "
                f"{self.group_size}): "
                + ", ".join(f"{group!r}: {count}" for group, count in incomplete.items()),
                kind="bad_input",
            )
        return _joined(self.backend, windows, outcomes, order)

    def _drained(self) -> tuple[list[_Window], list[str], dict[str, int]]:
        """Every ready item sent and every window ended (each bounds its own call; this wait is
        bounded too), then the step's state handed over and reset."""
        deadline = time.monotonic() + self.max_block_s
        self._check_owner()
        with self._cond:
            self._check_usable()
            self._barrier = True
            self._cond.notify_all()
            incomplete = self._incomplete()
            while self._ready or self._in_flight > 0:
                if time.monotonic() > deadline:
                    raise ScorerError(
                        f"the stream's barrier waited {self.max_block_s:.0f} s for "
                        f"{self._in_flight} windows"
                    )
                self._cond.wait(WAKE_S)
                self._check_usable()
            windows, order = self._windows, self._order
            self._windows, self._order, self._seen, self._grouped = [], [], set(), set()
            self._barrier = False
        return windows, order, incomplete

    # -- lifecycle ----------------------------------------------------------------------------
    def close(self) -> None:
        """Stop cutting windows; items not yet sent fail (ScorerItemsFailed), windows sent end on
        their own. In a fork, nothing here is the fork's to stop."""
        if os.getpid() != self._owner:
            return
        with self._cond:
            if self._closed:
                return
            self._closed = True
            unsent = [*self._ready, *self._held()]
            self._ready = []
            self._pending -= len(unsent)  # the windows in flight give theirs back as they end
            if self._groups is not None:
                self._groups.open.clear()
            self._cond.notify_all()
        error = ScorerItemsFailed(
            f"the stream over {type(self.backend).__name__} was closed before {len(unsent)} "
            f"items were sent",
            kind="items_failed",
            failed={item.id: "the stream was closed before it was sent" for item, _ in unsent},
        )
        for _, row in unsent:
            row.set_exception(error)

    def abandon(self) -> None:
        """Ctrl-C at the barrier: nobody reads these answers; what waits is never sent, what runs is
        interrupted (as a plain call's Ctrl-C)."""
        self.close()
        with self._cond:
            windows = list(self._windows)
        for window in windows:
            if isinstance(window.future, Submission):
                window.future.abandon()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, kind: object, *_: object) -> None:
        """Leaving early (an exception, Ctrl-C) abandons what is unread; leaving after the barrier
        closes."""
        if kind is None:
            self.close()
        else:
            self.abandon()

    # -- under the lock -----------------------------------------------------------------------
    def _check_owner(self) -> None:
        """Before taking the lock: a fork may have copied it held (by the worker, which did not
        fork)."""
        if os.getpid() != self._owner:
            raise BackendNotOwned(
                f"this stream belongs to pid {self._owner}; this is a fork of it (make a new one)"
            )

    def _check_usable(self) -> None:
        if self._closed:
            raise ScorerError(f"the stream over {type(self.backend).__name__} is closed")

    def _no_room(self) -> SubmissionQueueFull:
        held = len(self._held())
        if held == self._pending:
            why = "all held in incomplete groups, which only their other members free"
        else:
            why = (
                f"{held} of them held in incomplete groups; " * bool(held)
                + "the scorer does not keep up"
            )
        return SubmissionQueueFull(
            f"stream over {type(self.backend).__name__}: {self._pending} items still "
            f"unscored after {self.max_block_s:.2f} s (max_pending {self.max_pending}): {why}"
        )

    def _check_new(self, batch: list[RewardItem]) -> None:
        """Whether the stream may take `batch` now; changes nothing."""
        ids = [item.id for item in batch]
        again = [i for i in ids if i in self._seen] or [i for i in set(ids) if ids.count(i) > 1]
        if again:
            raise ScorerRequestError(
                f"item ids {sorted(again)[:5]} were already added to this step", kind="bad_input"
            )
        if self._groups is not None:
            self._check_groups(batch, self._groups)

    def _check_groups(self, batch: list[RewardItem], groups: _Groups) -> None:
        """Each item joins an open or a new group of this step, which it fits (size, common
        inputs)."""
        loose = next((item for item in batch if item.group_id is None), None)
        if loose is not None:
            raise ScorerRequestError(
                f"item {loose.id!r} has no group_id, but the stream keeps groups of "
                f"{groups.size} whole",
                kind="bad_input",
            )
        touched = list(dict.fromkeys(item.group_id for item in batch if item.group_id is not None))
        members = {group: list(groups.open.get(group, ([], []))[0]) for group in touched}
        for item in batch:
            members[str(item.group_id)].append(item)
        for group, joined in members.items():
            ids = [item.id for item in joined][:8]
            if group in self._grouped:
                raise ScorerRequestError(
                    f"group {group!r} is complete already: a group id names one group of "
                    f"{groups.size} until the barrier (ids {ids} came for it)",
                    kind="bad_input",
                )
            if len(joined) > groups.size:
                raise ScorerRequestError(
                    f"group {group!r} would have {len(joined)} items, more than "
                    f"{groups.size} (ids {ids})",
                    kind="bad_input",
                )
        # what a window's request would refuse, refused here: for the items that break it, not their
        # window
        try:
            partition(
                [item for joined in members.values() for item in joined], None, scorer="stream"
            )
        except GroupInputError as exc:
            raise ScorerRequestError(
                f"stream over {type(self.backend).__name__}: {exc}", kind="bad_input"
            ) from exc

    def _take(self, batch: list[RewardItem]) -> list[Future[ItemReward]]:
        """The commit of a checked add: nothing here can refuse."""
        rows: list[Future[ItemReward]] = []
        for _ in batch:
            row: Future[ItemReward] = Future()
            # a cancelled awaiter never cancels the row: its window still runs
            row.set_running_or_notify_cancel()
            rows.append(row)
        if self.collect:
            self._order.extend(item.id for item in batch)
            self._seen.update(item.id for item in batch)
        for item, row in zip(batch, rows, strict=True):
            self._hold(item, row)
        self._pending += len(batch)
        return rows

    def _hold(self, item: RewardItem, row: Future[ItemReward]) -> None:
        """Ready now, or held until its group is complete."""
        groups = self._groups
        if groups is None or item.group_id is None:
            self._make_ready([item], [row])
            return
        members, rows = groups.open.setdefault(item.group_id, ([], []))
        members.append(item)
        rows.append(row)
        if len(members) == groups.size:
            del groups.open[item.group_id]
            if self.collect:
                self._grouped.add(item.group_id)
            self._make_ready(members, rows)

    def _make_ready(self, items: list[RewardItem], rows: list[Future[ItemReward]]) -> None:
        if not self._ready:
            self._ready_since = time.monotonic()
        self._ready.extend(zip(items, rows, strict=True))

    def _held(self) -> list[tuple[RewardItem, Future[ItemReward]]]:
        if self._groups is None:
            return []
        return [
            pair
            for members, rows in self._groups.open.values()
            for pair in zip(members, rows, strict=True)
        ]

    def _incomplete(self) -> dict[str, int]:
        """At the barrier: the groups still open (their items are dropped, they fail)."""
        if self._groups is None or not self._groups.open:
            return {}
        held = self._held()
        counts = {group: len(members) for group, (members, _) in self._groups.open.items()}
        self._groups.open.clear()
        self._pending -= len(held)
        error = ScorerRequestError(
            f"its group was incomplete at the barrier ({counts})", kind="bad_input"
        )
        for _, row in held:
            row.set_exception(error)
        return counts

    def _due(self) -> float | None:
        """Seconds until a partial window is due (0: now), or None: nothing to cut."""
        if not self._ready:
            return None
        if len(self._ready) >= self.window or self._barrier:
            return 0.0 if self._in_flight < 2 else None
        if self._in_flight > 0 or self._ready_since is None:
            return None  # the scorer is busy: the window grows meanwhile
        return max(self._ready_since + self.max_wait_s - time.monotonic(), 0.0)

    def _cut(self, limit: int) -> _Window:
        """Up to `limit` (at most `window`) ready items, whole groups (a group larger than that:
        alone)."""
        count = min(limit, self.window, len(self._ready))
        if self._groups is not None:
            size = self._groups.size
            count = max(count - count % size, min(size, len(self._ready)))
        taken, self._ready = self._ready[:count], self._ready[count:]
        self._ready_since = time.monotonic() if self._ready else None
        window = _Window([item for item, _ in taken], [row for _, row in taken])
        self._in_flight += 1
        self.window_sizes.append(len(window.items))
        if self.collect:
            self._windows.append(window)
        return window

    # -- the worker ---------------------------------------------------------------------------
    def _start_worker(self) -> None:
        if self._worker is None:
            worker = threading.Thread(target=self._run, name="reward-stream", daemon=True)
            worker.start()
            self._worker = worker  # only once it runs: a start that failed is tried again

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._closed and (due := self._due()) != 0.0:
                    self._cond.wait(WAKE_S if due is None else min(due, WAKE_S))
                if self._closed:
                    return
                window = self._cut(self.window)
            self._send_all([window])

    def _send_all(self, windows: list[_Window]) -> list[Future[RewardResponse]]:
        """Each window cut sent; interrupted (Ctrl-C), the ones not sent fail, as close() fails what
        was never sent: a window cut always ends, so the barrier and the producers never wait on
        it."""
        try:
            return [self._send(window) for window in windows]
        finally:
            for window in windows:
                if window.future is None:
                    self._ended(
                        window,
                        _failed(
                            ScorerError("the stream's flush was interrupted before it was sent")
                        ),
                    )

    def _send(self, window: _Window) -> Future[RewardResponse]:
        try:
            future = self.backend.submit(
                RewardRequest(items=window.items, group_size=self.group_size)
            )
        except Exception as exc:  # noqa: BLE001 - a refused submission fails its window's items, typed
            future = _failed(exc)
        return self._ended(window, future)

    def _ended(self, window: _Window, future: Future[RewardResponse]) -> Future[RewardResponse]:
        """The window's outcome is `future`'s: its items and its room are settled when it ends."""
        window.future = future
        future.add_done_callback(lambda _: self._settle(window))
        return future

    def _settle(self, window: _Window) -> None:
        """A window's outcome to its items' futures; its room back to the producers (whatever
        happens)."""
        try:
            outcome = _outcome(window)
            error = outcome.error
            # what was scored, item by item (a window whose terms failed gives its items its error)
            taken = outcome.response if outcome.kind in ("scored", "items_failed") else None
            rows = _rows(taken) if taken is not None else {}
            for item, row in zip(window.items, window.rows, strict=True):
                if item.id in rows:
                    row.set_result(rows[item.id])
                else:
                    row.set_exception(
                        error
                        or ScorerError(f"item {item.id!r} is missing from its window's response")
                    )
        finally:
            with self._cond:
                self._in_flight -= 1
                self._pending -= len(window.items)
                self._cond.notify_all()


def _items_of(items: RewardItem | Sequence[RewardItem]) -> list[RewardItem]:
    """What `add` was given, as a list of RewardItems, or a typed refusal naming what is not one."""
    batch = [items] if isinstance(items, RewardItem) else list(items)
    for index, item in enumerate(batch):
        if not isinstance(item, RewardItem):
            raise ScorerRequestError(
                f"a stream takes RewardItems: items[{index}] is a {type(item).__name__}",
                kind="bad_input",
            )
    return batch


def _failed(error: BaseException) -> Future[RewardResponse]:
    future: Future[RewardResponse] = Future()
    future.set_exception(error)
    return future


def _rows(response: RewardResponse) -> dict[str, ItemReward]:
    usable = response.usable()
    return {
        item_id: ItemReward(
            item_id,
            response.rewards[i],
            {name: values[i] for name, values in response.component_rewards.items()},
            usable[i],
            response.errors[i],
            response.details_for(item_id),
        )
        for i, item_id in enumerate(response.ids)
    }


def _outcome(window: _Window) -> Outcome:
    """An ended window's outcome (a submission keeps its own; another future's is read from it)."""
    future = window.future
    assert future is not None and future.done()  # the barrier waited for it
    if isinstance(future, Submission) and future.outcome is not None:
        return future.outcome
    if future.cancelled():
        return Outcome.raised(ScorerError("the stream's window was cancelled before it was sent"))
    error = future.exception()
    return Outcome.raised(error) if error is not None else Outcome.scored(future.result())


def _joined(
    backend: Streamed, windows: list[_Window], outcomes: list[Outcome], order: list[str]
) -> RewardResponse:
    """One response in add order; or one error naming every item the failed windows cost."""
    name = type(backend).__name__
    responses = [
        outcome.response for outcome in outcomes if outcome.ok and outcome.response is not None
    ]
    diagnostics = merge_term_reports(response.diagnostics for response in responses)
    if len(responses) == len(outcomes):
        return join_rows(order, rows_by_id(responses), diagnostics) if order else _empty()
    joined = shares_failed(f"stream over {name}", order, outcomes)
    if joined is not None:
        return joined.result()  # raises: the windows' item or term failures, joined
    failed: dict[str, str] = {}
    first: BaseException | None = None
    for window, outcome in zip(windows, outcomes, strict=True):
        if outcome.error is not None:
            first = first or outcome.error
            why = (
                str(outcome.error).splitlines()[0]
                if str(outcome.error)
                else type(outcome.error).__name__
            )
            failed.update({item.id: why for item in window.items})
    kept = [item_id for item_id in order if item_id not in failed]
    partial = join_rows(kept, rows_by_id(responses), diagnostics) if kept else None
    error = ScorerItemsFailed(
        f"stream over {name}: {len(failed)} of {len(order)} items were not scored "
        f"({len(outcomes) - len(responses)} of {len(outcomes)} windows failed): "
        f"{next(iter(failed.values()))}",
        kind="items_failed",
        failed=failed,
        partial=partial,
    )
    raise error from first


def _empty() -> RewardResponse:
    return RewardResponse(ids=[], rewards=[], component_rewards={})


def _check_settings(
    backend: Streamed,
    size: int | None,
    window: int,
    max_wait_s: float,
    max_pending: int,
    max_block_s: float,
    whole_groups: bool,
) -> None:
    """ValueError or ConfigError for bounds no stream can keep, before anything is set up."""
    if window < 1 or max_pending < window or not (max_wait_s >= 0 and max_block_s > 0):
        raise ValueError(
            "need window >= 1, max_pending >= window, max_wait_s >= 0 and max_block_s > 0"
        )
    if size is None and whole_groups:
        raise ConfigError(
            f"{type(backend).__name__} scores whole groups: give the stream group_size, "
            f"so it knows when a "
            "group is complete"
        )
    if size is not None and size > max_pending:
        raise ValueError(
            f"max_pending {max_pending} is less than a group ({size}): no group could complete"
        )
