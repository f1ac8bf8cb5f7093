"""Coalesce concurrent per-item coroutine calls into one batch call (bounded wait, bounded size).

verl's async reward loop makes one task per rollout; one request per item would pay a round
trip (and a child's fixed cost) per item. Calls that arrive together are held for at most
`max_wait_s` after the first one, or until `max_batch` wait, then scored in one call; each
caller gets its own row back. A failed batch fails every call in it with the same typed error,
never a default value. State is per event loop: a caller on another loop never waits on this one.
"""

from __future__ import annotations

import asyncio
import weakref
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

In = TypeVar("In")
Out = TypeVar("Out")


@dataclass
class _Pending(Generic[In, Out]):
    rows: list[tuple[In, asyncio.Future[Out]]] = field(default_factory=list)
    timer: asyncio.TimerHandle | None = None


class Coalescer(Generic[In, Out]):
    """`await coalescer(row)` -> that row's result from `score_batch(rows)`, batched with its neighbours."""

    def __init__(
        self,
        score_batch: Callable[[list[In]], Awaitable[Sequence[Out]]],
        max_batch: int = 256,
        max_wait_s: float = 0.005,
    ) -> None:
        if max_batch < 1 or max_wait_s < 0:
            raise ValueError(f"max_batch must be >= 1 and max_wait_s >= 0, got {max_batch}, {max_wait_s}")
        self.score_batch = score_batch
        self.max_batch = max_batch
        self.max_wait_s = max_wait_s
        self.batch_sizes: deque[int] = deque(maxlen=1024)  # the latest batches sent, for tests and metrics
        self._pending: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Pending[In, Out]] = (
            weakref.WeakKeyDictionary()
        )
        self._running: set[asyncio.Task[None]] = set()

    async def __call__(self, row: In) -> Out:
        loop = asyncio.get_running_loop()
        pending = self._pending.setdefault(loop, _Pending())
        future: asyncio.Future[Out] = loop.create_future()
        pending.rows.append((row, future))
        if len(pending.rows) >= self.max_batch:
            self._flush(loop)
        elif pending.timer is None:
            pending.timer = loop.call_later(self.max_wait_s, self._flush, loop)
        return await future

    def _flush(self, loop: asyncio.AbstractEventLoop) -> None:
        pending = self._pending.pop(loop, None)
        if pending is None or not pending.rows:
            return
        if pending.timer is not None:
            pending.timer.cancel()
        task = loop.create_task(self._score(pending.rows))
        self._running.add(task)
        task.add_done_callback(self._running.discard)

    async def _score(self, rows: list[tuple[In, asyncio.Future[Out]]]) -> None:
        self.batch_sizes.append(len(rows))
        try:
            results = await self.score_batch([row for row, _ in rows])
            if len(results) != len(rows):
                raise RuntimeError(f"a batch of {len(rows)} rows came back with {len(results)} results")
        except asyncio.CancelledError:
            for _, future in rows:
                future.cancel()
            raise
        except Exception as exc:  # noqa: BLE001 - handed to every caller of the batch, none dropped
            for _, future in rows:
                if not future.done():
                    future.set_exception(exc)
            return
        for (_, future), result in zip(rows, results, strict=True):
            if not future.done():  # a caller cancelled while waiting: its row was scored all the same
                future.set_result(result)
