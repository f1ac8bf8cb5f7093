"""A Ray pool call's shares raced against the hedge delay: no actor holds a step (issue 43).

Each share goes to its actor. One not answered within the pool's hedge delay (the p95 of its
recent shares, `compose.hedging.Latencies`) is sent once more, to the actor of the pool that holds
the fewest of this call's sends, and the first good answer wins. The other send is withdrawn
(`PoolActor.withdraw`): out of its actor's queue if it has not begun, left to finish if it is
scoring, and never read; its actor stops it at the call's deadline, as the pool's cancel would
have: a hedge alone never costs a child. A failure while the other send is still out waits for
that one; an answer of another identity fails the share at once. At the call's deadline what is
left is cancelled as every pool call's is (`RayPoolBackend._outcomes`): both sends of a late
share, each actor then stopping its own.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, TypeAlias

from supervisor.compose.hedging import HEDGES_SENT, HEDGES_WON, Latencies
from supervisor.errors import PoolIdentityChanged
from supervisor.outcome import Outcome

# The pool (`RayPoolBackend`) and its members (`_Member`) are typed Any here: ray_pool imports this
# module, and the floor plan allows no cycle, not even for types.
RayPoolBackend: TypeAlias = Any
_Member: TypeAlias = Any


@dataclass
class _Share:
    key: str
    part: Any  # the share's request in the object store
    ids: list[str]
    what: str
    sends: list[tuple[_Member, Any, float]] = field(default_factory=list)  # member, ref, began
    hedged_at: float | None = None  # the delay it was hedged at
    result: Outcome | None = None
    failure: Outcome | None = None  # a send's failure while the other was still out


@dataclass
class _Race:
    ray: Any
    pool: RayPoolBackend
    latencies: Latencies | None  # None: no hedges
    deadline: float
    shares: list[_Share]
    out: dict[Any, _Share] = field(default_factory=dict)  # every unanswered send's ref
    load: Counter[int] = field(default_factory=Counter)  # this call's sends per actor
    won: int = 0

    def send(self, share: _Share, member: _Member) -> None:
        left = max(self.deadline - time.monotonic(), 0.0)
        ref = member.handle.score.remote(share.part, share.key, left)
        share.sends.append((member, ref, time.monotonic()))
        self.out[ref] = share
        self.load[member.index] += 1

    def hedge_due(self, now: float) -> float:
        """Hedge every share past the delay that has none yet; when the next one falls due."""
        if self.latencies is None:
            return self.deadline
        delay, due = self.latencies.delay(), self.deadline
        for share in self.shares:
            if share.result is not None or share.hedged_at is not None:
                continue
            first = share.sends[0][2]
            if now - first < delay:
                due = min(due, first + delay)
                continue
            target = self.target(share)
            share.hedged_at = delay
            if target is not None:
                self.send(share, target)
                self.latencies.count(won=False)
        return due

    def target(self, share: _Share) -> _Member | None:
        """The serving actor holding the fewest of this call's sends, not this share's."""
        taken = {member.index for member, _, _ in share.sends}
        others = [m for m in self.pool._pool if m.index not in taken and m.info is not None]
        return min(others, key=lambda m: (self.load[m.index], m.index), default=None)

    def answered(self, ref: Any) -> None:
        """One send's answer: the share's if good, of another identity, or its last send."""
        share = self.out.pop(ref)
        if share.result is not None:
            return  # the loser, answering after all: never read
        member, _, began = next(s for s in share.sends if s[1] is ref)
        try:
            answer: Any = self.ray.get(ref, timeout=0)
        except Exception as exc:  # noqa: BLE001 - translated here, joined or raised by the pool
            answer = self.pool._translated(exc, member, share.what)
        outcome = self.pool._accepted(member, answer, share.ids)
        rest = [r for r, s in self.out.items() if s is share]
        stands = outcome.kind == "scored" or isinstance(outcome.error, PoolIdentityChanged)
        if not stands and rest:
            share.failure = share.failure or outcome
            return  # the other send may still answer it
        share.result = outcome
        if outcome.kind == "scored" and self.latencies is not None:
            hedge = len(share.sends) > 1 and ref is share.sends[1][1]
            self.won += hedge
            if hedge:
                self.latencies.count(won=True)
            # a first send given up counts as the delay it was hedged at (compose.hedging)
            waited = time.monotonic() - began
            self.latencies.add(share.hedged_at if hedge and share.hedged_at else waited)
        for other in rest:
            self.out.pop(other)
            loser = next(m for m, r, _ in share.sends if r is other)
            loser.handle.withdraw.remote(share.key)

    def run(self) -> list[Outcome]:
        while self.out and time.monotonic() < self.deadline:
            due = self.hedge_due(time.monotonic())
            ready, _ = self.ray.wait(
                list(self.out), num_returns=1, timeout=max(0.0, due - time.monotonic())
            )
            for ref in ready:
                self.answered(ref)
        return self.finish()

    def finish(self) -> list[Outcome]:
        """Past the deadline: every send still out is cancelled and its actor's answer to that
        waited for. A share takes an answer of another identity first, then a good one, then a
        send's own failure (one that came while the other send was out), then the cancel's."""
        late = [s for s in self.shares if s.result is None]
        sends = [(m, r, s) for s in late for m, r, _ in s.sends if r in self.out]
        found = self.pool._outcomes(
            [m for m, _, _ in sends], [r for _, r, _ in sends], time.monotonic(),
            [s.what for _, _, s in sends],
        )  # fmt: skip
        outcomes: dict[str, list[Outcome]] = {s.key: [] for s in late}
        for (member, _, share), answer in zip(sends, found, strict=True):
            outcomes[share.key].append(self.pool._accepted(member, answer, share.ids))
        for share in late:
            share.result = _first_standing([*outcomes[share.key], share.failure])
        return [s.result for s in self.shares if s.result is not None]


def _first_standing(outcomes: list[Outcome | None]) -> Outcome | None:
    """Of one share's outcomes: another identity's first, then a good one, then the first."""
    known = [o for o in outcomes if o is not None]
    for standing in (
        lambda o: isinstance(o.error, PoolIdentityChanged),
        lambda o: o.kind == "scored",
        lambda o: True,
    ):
        for outcome in known:
            if standing(outcome):
                return outcome
    return None


def race(
    ray: Any,
    pool: RayPoolBackend,
    sent: Sequence[tuple[_Member, Any, list[str], str]],
    latencies: Latencies | None,
    deadline: float,
) -> tuple[list[Outcome], dict[str, int]]:
    """Each (member, part, ids, what) sent, raced (hedged with `latencies`' delay; None: not); the
    outcomes in `sent`'s order, and the call's hedges as counts for its response (`HEDGES_SENT`,
    `HEDGES_WON`)."""
    call = uuid.uuid4().hex[:12]
    shares = [_Share(f"{call}.{n}", part, ids, what) for n, (_, part, ids, what) in enumerate(sent)]
    state = _Race(ray, pool, latencies, deadline, shares)
    for share, (member, *_rest) in zip(shares, sent, strict=True):
        state.send(share, member)
    outcomes = state.run()
    hedges = sum(1 for s in shares if s.hedged_at is not None and len(s.sends) > 1)
    return outcomes, {HEDGES_SENT: hedges, HEDGES_WON: state.won}
