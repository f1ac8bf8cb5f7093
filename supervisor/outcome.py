"""What a backend scored for a request, and what failed, as one value.

Inside the library a backend's answer is an `Outcome`: panels, replicas, servers, a Ray pool's
shares and streams combine outcomes; `Outcome.result()` is where an exception is raised, once, at
the trainer's boundary (`compute_rewards`). The error raised there keeps a read-only copy of what
was scored for a trainer that wants it (`ScorerItemsFailed.partial`, `ScorerTermsFailed.response`);
nothing inside the library reads it back.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from supervisor.errors import ScorerItemsFailed, ScorerTermsFailed
from supervisor.types import RewardResponse

Kind = Literal["scored", "items_failed", "terms_failed", "failed"]


@dataclass(frozen=True)
class Outcome:
    """One of: `scored` (the response holds every id); `items_failed` (the scorer could not score
    the ids in `failed`, the response holds the others); `terms_failed` (the response holds every
    id, some terms of the reward failed alone for the ids in `failed`); `failed` (no response)."""

    kind: Kind
    response: RewardResponse | None = None
    error: BaseException | None = None  # what `result()` raises (None: scored)
    failed: Mapping[str, str] = field(default_factory=dict)  # id -> why

    @classmethod
    def scored(cls, response: RewardResponse) -> Outcome:
        return cls("scored", response)

    @classmethod
    def raised(cls, error: BaseException) -> Outcome:
        """A failure of the whole call: nothing scored."""
        return cls("failed", error=error)

    @classmethod
    def items_failed(cls, error: ScorerItemsFailed, partial: RewardResponse) -> Outcome:
        return cls("items_failed", partial, error, dict(error.failed))

    @classmethod
    def terms_failed(cls, error: ScorerTermsFailed, response: RewardResponse) -> Outcome:
        return cls("terms_failed", response, error, dict(error.failed))

    @property
    def ok(self) -> bool:
        return self.kind == "scored"

    def result(self) -> RewardResponse:
        """The response, or the typed error: the trainer's boundary."""
        if self.error is not None:
            raise self.error
        assert self.response is not None  # scored: a response by construction
        return self.response


def as_outcomes(results: Sequence[Outcome | BaseException]) -> list[Outcome]:
    """What a fan-out returned (each call's outcome, or what it raised) as outcomes."""
    return [result if isinstance(result, Outcome) else Outcome.raised(result) for result in results]
