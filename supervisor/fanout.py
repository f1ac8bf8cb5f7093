"""One call per backend (or per chunk), all at once, each in its own daemon thread: starting a
panel's or a term's children together (not one after another), closing them under one deadline,
sending the chunks of a request to a scorer that takes concurrent calls.

Why daemon threads and not an executor: an executor's threads are joined at interpreter exit,
so a trainer interrupted while children boot would wait for every boot first. Here Ctrl-C
kills what is booting (`abort_start`), waits for the threads (now quick) and re-raises.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from supervisor.backend import RewardBackend

T = TypeVar("T")
R = TypeVar("R")


def on_each(
    items: Sequence[T], call: Callable[[T], R], name: str = "fanout", limit: int | None = None
) -> list[R | BaseException]:
    """`call(item)` for every item at once (at most `limit` at a time); each one's result or exception,
    in order. Each call must bound itself (the backends' own deadlines): this waits for all of them."""
    if len(items) == 1:
        try:
            return [call(items[0])]
        except Exception as exc:  # noqa: BLE001 - handed back like the threaded ones
            return [exc]
    outcomes: list[R | BaseException | None] = [None] * len(items)
    indexes = iter(range(len(items)))
    taking = threading.Lock()

    def run() -> None:
        while True:
            with taking:
                index = next(indexes, None)
            if index is None:
                return
            try:
                outcomes[index] = call(items[index])
            except BaseException as exc:  # noqa: BLE001 - handed to the caller, which raises or records it
                outcomes[index] = exc

    count = len(items) if limit is None else max(1, min(limit, len(items)))
    threads = [threading.Thread(target=run, name=f"{name}-{i}", daemon=True) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return outcomes  # type: ignore[return-value]  # every slot was filled by its thread


def build_all(builds: Sequence[Callable[[], RewardBackend]]) -> list[RewardBackend]:
    """Make each backend and start it (when it waits to be started), all at once. If any fails, or
    Ctrl-C arrives, what is booting is killed, every backend made is closed, and the (first) error
    is raised: nothing is left running."""
    made: list[RewardBackend | None] = [None] * len(builds)

    def build_and_start(index: int) -> RewardBackend:
        backend = made[index] = builds[index]()
        if backend.needs_start:
            backend.start()
        return backend

    try:
        outcomes = on_each(range(len(builds)), build_and_start, "start")
    except BaseException:  # Ctrl-C while joining: stop the boots, then wait for their threads to see it
        _abandon(made)
        raise
    errors = [outcome for outcome in outcomes if isinstance(outcome, BaseException)]
    if errors:
        _abandon(made)
        raise errors[0]
    return [backend for backend in made if backend is not None]


def _abandon(made: list[RewardBackend | None]) -> None:
    for backend in made:
        if backend is not None:
            backend.abort_start()
    for backend in made:
        if backend is not None:
            backend.close()
