"""One call per item, all at once, each in its own daemon thread: starting a panel's or a term's
children together (not one after another), closing them under one deadline, sending the chunks
of a request to a scorer that takes concurrent calls, scoring a panel's terms.

Why daemon threads and not an executor: an executor's threads are joined at interpreter exit,
so a trainer interrupted while children boot would wait for every boot first. With these,
Ctrl-C kills what is booting (`compose.build.build_all`), waits for the threads (now quick) and
re-raises.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")


def on_each(
    items: Sequence[T],
    call: Callable[[T], R],
    name: str = "fanout",
    limit: int | None = None,
    on_interrupt: Callable[[], None] = lambda: None,
) -> list[R | BaseException]:
    """`call(item)` for every item at once (at most `limit` at a time); each one's result or
    exception, in order. Each call must bound itself (the backends' own deadlines): this waits for
    all of them. Interrupted while waiting (Ctrl-C), it runs `on_interrupt` (end the calls that can
    be ended) and re-raises: nobody will read their outcomes."""
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
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    except BaseException:
        on_interrupt()
        raise
    return outcomes  # type: ignore[return-value]  # every slot was filled by its thread
