"""What the library asks of a backend it holds, beyond the trainer's ten names.

A panel, a replica set, a multi-server client, a Ray pool and `DistributedRewards` hold backends
and ask each one: what it scores (`shape`, `identity_hash`, `combination`), the group size it was
configured with, what it holds (`members`, `leaves`), whether a call must keep groups whole and how
long one may take, how many ranks score a call, and how to start, warm or interrupt it. Every
built-in backend is a `Component` and answers for itself; a trainer's own `RewardBackend` is seen
through `component()` as a leaf that says nothing of its scorer, so it can stand in a panel as is.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence
from typing import Any

from supervisor.arena import Arena
from supervisor.backend import RewardBackend
from supervisor.outcome import Outcome
from supervisor.shape import ScorerShape
from supervisor.types import RewardRequest, RewardResponse


class Component(RewardBackend):
    """A RewardBackend the library can hold: the trainer's contract plus the composition questions,
    each with the answer of a leaf that scores alone. Composites override `members`. A component
    scores in `score`, which answers an `Outcome` (a value); `compute_rewards` raises from it."""

    shape: ScorerShape | None = None  # the scorer behind it, once known (None for a panel)
    group_size: int | None = None  # configured: every group of every request must have this size
    # made with start=False and not started yet (a managed child's backend)
    needs_start: bool = False

    @abstractmethod
    def score(self, request: RewardRequest) -> Outcome:
        """What this backend scored of `request` and what failed; a failure of the whole call may be
        raised (composites take it as that member's outcome, see `outcome_of`)."""

    def compute_rewards(self, request: RewardRequest) -> RewardResponse:
        return self.score(request).result()

    @property
    def identity_hash(self) -> str | None:
        """The catalog identity of what this backend scores (see scorers.identity)."""
        return self.shape.identity_hash if self.shape else None

    @property
    def combination(self) -> dict[str, Any] | None:
        """How its own reward combines its scorer's terms (required terms, weights): part of a
        panel's identity when a term takes that reward."""
        return None

    @property
    def max_pending(self) -> int:
        """Submissions that may wait (see supervisor.submit)."""
        return self._max_pending

    @max_pending.setter
    def max_pending(self, value: int) -> None:
        self._max_pending = value

    @property
    def max_queue_wait_s(self) -> float:
        """How long `compute_rewards_async` waits for room in the submission queue."""
        return self._max_queue_wait_s

    @max_queue_wait_s.setter
    def max_queue_wait_s(self, value: float) -> None:
        self._max_queue_wait_s = value

    # -- what it holds, and what follows from it -------------------------------------------------
    def members(self) -> Sequence[RewardBackend]:
        """The backends this one holds (a panel's, its replicas, the one it wraps); a leaf holds
        none."""
        return ()

    def leaves(self) -> list[RewardBackend]:
        """The backends that score, below every composite (itself, for a leaf)."""
        members = self.members()
        return (
            [leaf for member in members for leaf in component(member).leaves()]
            if members
            else [self]
        )

    def warming(self) -> bool:
        """Whether something it started is still coming up after it said ready (a math child's
        grading workers): a server over it (`serve --recipe`) says ready only once none is."""
        return any(component(member).warming() for member in self.members())

    def needs_whole_groups(self, sizes_checked: bool = False) -> bool:
        """Whether scoring a group's candidates apart could change a reward or refuse a call: a
        configured group size, or a scorer that compares a group's candidates (or an unknown one)
        anywhere inside: a `per_candidate` groupwise rule (format_reward) is not one.
        `sizes_checked`: the caller checks each group's size over the whole group itself
        (DistributedRewards, across ranks), so a configured size alone is no reason."""
        if self.group_size is not None and not sizes_checked:
            return True
        members = self.members()
        if members:
            return any(component(member).needs_whole_groups(sizes_checked) for member in members)
        return self.shape is None or self.shape.whole_groups

    @property
    def call_bound_s(self) -> float | None:
        """The longest one call may take by the backends' own deadlines (a restart's boot plus a
        request); None where no backend inside states one."""
        bounds = [component(member).call_bound_s for member in self.members()]
        return max((bound for bound in bounds if bound is not None), default=None)

    @property
    def scoring_world(self) -> tuple[int, int]:
        """(this rank, how many ranks) one call is scored over: (0, 1) for a backend scoring alone
        (only DistributedRewards spans more than one)."""
        return (0, 1)

    # -- lifecycle beyond the trainer's: start, abort, interrupt ---------------------------------
    def start(self) -> Any:
        """Start what the backend runs, if it was made with `start=False` (a managed child); a
        backend with nothing to start is ready when made."""
        return None

    def abort_start(self) -> None:
        """From another thread: kill what `start()` is booting, so that it fails at once
        (Ctrl-C)."""
        return None

    def interrupt(self) -> None:
        """Give up on calls in flight from other threads (Ctrl-C in a caller that fanned them
        out)."""
        return None

    def _interrupt(self) -> None:
        self.interrupt()

    def _grouping(self) -> tuple[int | None, bool]:
        return self.group_size, self.needs_whole_groups()

    def _outcome(self, request: RewardRequest) -> Outcome:
        return self.score(request)


class Wrapper(Component):
    """A component over one other backend (`self.backend`, set by the subclass): waking,
    sleeping, draining, the arena, interrupts and owner checks are that backend's."""

    backend: RewardBackend

    def onload(self) -> dict[str, Any]:
        return self.backend.onload()

    def offload(self) -> dict[str, Any]:
        return self.backend.offload()

    def drain(self) -> dict[str, Any]:
        return self.backend.drain()

    def arena(self) -> Arena:
        return self.backend.arena()

    def interrupt(self) -> None:
        component(self.backend).interrupt()

    def _check_owner(self) -> None:
        self.backend._check_owner()


class _Plain(Component):
    """A trainer's own RewardBackend as the library sees it: a leaf of an unknown scorer."""

    def __init__(self, backend: RewardBackend) -> None:
        self.backend = backend

    def score(self, request: RewardRequest) -> Outcome:
        return Outcome.scored(self.backend.compute_rewards(request))

    def leaves(self) -> list[RewardBackend]:
        return [self.backend]


def component(backend: RewardBackend) -> Component:
    """`backend` as the library asks it its composition questions (itself, for a built-in one)."""
    return backend if isinstance(backend, Component) else _Plain(backend)


def leaf_shapes(backend: RewardBackend) -> list[ScorerShape]:
    """The scorers below `backend`, those whose backends know them (a trainer's own says
    nothing)."""
    shapes = (component(leaf).shape for leaf in component(backend).leaves())
    return [shape for shape in shapes if shape is not None]


def outcome_of(backend: RewardBackend, request: RewardRequest) -> Outcome:
    """What `backend` makes of `request`, any failure included, as a value: what a composite
    combines. Ctrl-C (not an Exception) still ends the call."""
    try:
        return component(backend).score(request)
    except Exception as exc:  # noqa: BLE001 - a member's failure is its outcome: the composite decides
        return Outcome.raised(exc)
