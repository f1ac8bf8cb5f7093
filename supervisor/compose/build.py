"""Starting the backends a composite holds, all at once, with nothing left running on failure."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from supervisor.backend import RewardBackend
from supervisor.composition import component
from supervisor.fanout import on_each


def build_all(builds: Sequence[Callable[[], RewardBackend]]) -> list[RewardBackend]:
    """Make each backend and start it (when it waits to be started), all at once. If any fails, or
    Ctrl-C arrives, what is booting is killed, every backend made is closed, and the (first) error
    is raised: nothing is left running."""
    made: list[RewardBackend | None] = [None] * len(builds)

    def build_and_start(index: int) -> RewardBackend:
        backend = made[index] = builds[index]()
        if component(backend).needs_start:
            component(backend).start()
        return backend

    try:
        outcomes = on_each(range(len(builds)), build_and_start, "start")
    # Ctrl-C while joining: stop the boots, then wait for their threads to see it
    except BaseException:
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
            component(backend).abort_start()
    for backend in made:
        if backend is not None:
            backend.close()
