"""Scoring that overlaps generation: the UniRL `RewardStack` pattern on any backend or panel.

A shard is cut into micro-batches, each extended to the end of its last group (a group is
never split between micros); each micro is submitted for scoring as soon as it is generated,
while the next one is generated. Responses come back in micro order. A scorer failure raises
at the next micro boundary once it is known, and at `results()` at the latest: never later,
never silently.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Self, TypeVar

from scorers.groups import NotContiguous, contiguous_runs, pack_chunks
from supervisor.backend import RewardBackend
from supervisor.errors import ScorerRequestError
from supervisor.types import RewardItem, RewardResponse

T = TypeVar("T")
UNBOUNDED = 2**62


def micro_batches(
    items: Sequence[T], micro_size: int, group_of: Callable[[T], str | None]
) -> list[list[T]]:
    """`micro_size` rows per micro, each extended to the end of its last group (groups must be
    contiguous, as GRPO samplers lay them out); an ungrouped row is its own group."""
    if micro_size < 1:
        raise ValueError(f"micro_size must be >= 1, got {micro_size}")
    try:
        runs = contiguous_runs([group_of(item) for item in items])
    except NotContiguous as exc:
        raise ScorerRequestError(
            f"group {exc.group!r} is not contiguous in the shard (row {exc.position})",
            kind="bad_input",
        ) from exc
    return [
        [items[position] for position in chunk]
        for chunk in pack_chunks(runs, micro_size, at_least=True)
    ]


class OverlappedScoring:
    """Submit each micro's items as they are generated; collect the responses in micro order. A thin
    use of the backend's stream: each micro is added, then flushed as one window (a group a micro
    left incomplete waits in the stream for the rest of it).

    Use as a context manager: leaving it early (an exception, Ctrl-C) cancels what was not sent.
    """

    def __init__(self, backend: RewardBackend, group_size: int | None = None) -> None:
        self.backend = backend
        self.group_size = group_size
        # windows as large as a micro, cut only at a micro boundary (the trainer paces it); each
        # micro's response is its window's, so the stream keeps nothing for a barrier
        self._stream = backend.stream(
            group_size, window=UNBOUNDED, max_wait_s=math.inf, max_pending=UNBOUNDED, collect=False
        )
        self._futures: list[Future[RewardResponse]] = []

    def add(self, items: Sequence[RewardItem]) -> None:
        """A micro boundary: raise a failure already known, then send this micro."""
        self.raise_if_failed()
        self._stream.add(items)
        self._futures.extend(self._stream.flush())

    def raise_if_failed(self) -> None:
        for index, future in enumerate(self._futures):
            error = future.exception() if future.done() else None
            if error is not None:
                error.add_note(f"while scoring micro-batch {index}")
                raise error

    def results(self) -> list[RewardResponse]:
        """Every micro's response, in micro order (waits for them; the first failure raises)."""
        return [future.result() for future in self._futures]

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stream.close()
        for future in self._futures:
            future.cancel()  # only what still waits: a request in flight ends with its own deadline


def score_while_generating(
    backend: RewardBackend,
    micros: Sequence[T],
    generate: Callable[[T], Sequence[RewardItem]],
    group_size: int | None = None,
) -> list[RewardResponse]:
    """Generate micro i+1 while micro i is scored; return the responses in micro order."""
    with OverlappedScoring(backend, group_size) as stack:
        for micro in micros:
            stack.add(generate(micro))
        return stack.results()
