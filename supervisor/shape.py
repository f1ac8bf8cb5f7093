"""What a backend knows of its scorer (`ScorerShape`), and the checks of a configuration against
it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from scorers.base import ScorerSpec
from supervisor.errors import ConfigError, RewardContractError


@dataclass(frozen=True)
class ScorerShape:
    """What a backend knows of its scorer before it cuts a request into chunks."""

    name: str
    terms: tuple[str, ...]
    groupwise: bool = False
    ragged_groups: bool = False
    per_candidate: bool = False  # groupwise, but each candidate scored on its own (ScorerSpec)
    identity_hash: str | None = None
    revision: str | None = None
    diagnostics: tuple[str, ...] = ()
    details: tuple[str, ...] = ()  # the keys of its per-item details (scorers.details)
    # what it reads of an item (what a group rebuilt across ranks carries)
    required_fields: tuple[str, ...] = ()
    # chunks of one request it takes at once (see ScorerSpec.concurrent_calls)
    concurrent_calls: int = 1
    # the term that is its reward by itself (a served panel, see reward_terms)
    reward_term: str | None = None

    @property
    def whole_groups(self) -> bool:
        """Whether scoring a group's candidates apart could change a reward (ScorerSpec's)."""
        return self.groupwise and not self.per_candidate

    @classmethod
    def of_spec(cls, spec: ScorerSpec, identity_hash: str | None) -> ScorerShape:
        """An in-process scorer's shape, from its spec."""
        return cls(
            name=spec.name,
            terms=spec.term_names(),
            groupwise=spec.groupwise,
            ragged_groups=spec.ragged_groups,
            per_candidate=spec.per_candidate,
            identity_hash=identity_hash,
            revision=spec.revision,
            diagnostics=spec.diagnostics,
            details=spec.details,
            required_fields=spec.required_fields,
            concurrent_calls=max(1, spec.concurrent_calls),
        )

    @classmethod
    def from_entry(cls, entry: Any, where: str = "the scorer") -> ScorerShape:
        """From a child's readiness line or a server's /health (`ScorerHost.catalog_entry`); one
        that does not say what it serves is a RewardContractError naming `where` (not a scorer
        server)."""
        terms = entry.get("terms") if isinstance(entry, Mapping) else None
        calls = entry.get("concurrent_calls", 1) if isinstance(entry, Mapping) else None
        if (
            not isinstance(entry, Mapping)
            or not isinstance(entry.get("scorer"), str)
            or not isinstance(terms, list)
            or not all(isinstance(term, str) for term in terms)
            or isinstance(calls, bool)
            or not isinstance(calls, int)
        ):
            fields = sorted(entry)[:12] if isinstance(entry, Mapping) else type(entry).__name__
            raise RewardContractError(
                f"{where} does not say what it serves (a 'scorer' name, its 'terms', an int "
                f"'concurrent_calls'; got {fields}): is it a managed-scorers server?"
            )
        return cls(
            name=str(entry["scorer"]),
            terms=tuple(entry["terms"]),
            groupwise=bool(entry.get("groupwise", False)),
            ragged_groups=bool(entry.get("ragged_groups", False)),
            per_candidate=bool(entry.get("per_candidate", False)),
            identity_hash=entry.get("identity_hash"),
            revision=entry.get("revision"),
            diagnostics=tuple(entry.get("diagnostics", ())),
            details=tuple(entry.get("details", ())),
            required_fields=tuple(entry.get("required_fields", ())),
            concurrent_calls=max(1, calls),
            reward_term=entry.get("reward_term")
            if isinstance(entry.get("reward_term"), str)
            else None,
        )


def check_pins(shape: ScorerShape, revision: str | None, identity_hash: str | None) -> None:
    """A configured revision or identity hash must be exactly the scorer's own."""
    if revision is not None and revision != shape.revision:
        raise ConfigError(
            f"revision pin {revision!r} refused: scorer {shape.name!r} is revision "
            f"{shape.revision!r}"
        )
    if identity_hash is not None and identity_hash != shape.identity_hash:
        raise ConfigError(
            f"identity_hash pin {identity_hash} refused: scorer {shape.name!r} has identity "
            f"{shape.identity_hash}"
        )


def check_reward_names(
    scorer: str, terms: Sequence[str], required: Sequence[str], weights: Mapping[str, float]
) -> list[str]:
    """The terms that make the reward (default: all of the scorer's); unknown names are a
    ConfigError."""
    required = list(required) or list(terms)
    unknown = sorted((set(required) | set(weights)) - set(terms))
    if unknown:
        raise ConfigError(
            f"required_rewards/weights {unknown} are not terms of scorer {scorer!r} (it has "
            f"{list(terms)})"
        )
    return required


def reward_terms(
    shape: ScorerShape, required: Sequence[str], weights: Mapping[str, float]
) -> tuple[list[str], list[str] | None]:
    """The terms that make the reward, and the terms a request asks the server for (None: all). A
    scorer whose reward is one of its terms (`reward_term`: a served panel's weighted reward) weighs
    its terms itself: `required` then names the terms wanted, the server's reward sums only those,
    and client-side weights are refused (they would weigh the panel's reward again)."""
    reward_term = shape.reward_term
    if reward_term is None:
        return check_reward_names(shape.name, shape.terms, required, weights), None
    if weights:
        raise ConfigError(
            f"scorer {shape.name!r} weighs its own terms into {reward_term!r} (a served "
            f"panel: its recipe's weights); give no client weights ({sorted(weights)})"
        )
    if reward_term not in shape.terms:
        raise RewardContractError(
            f"scorer {shape.name!r} names reward term {reward_term!r}, not one of its terms"
        )
    wanted = [
        term
        for term in check_reward_names(shape.name, shape.terms, required, {})
        if term != reward_term
    ]
    return [reward_term], ([*wanted, reward_term] if required and wanted else None)
