"""`map_candidates`: lift a per-candidate function to the group contract.

A rule that scores each candidate on its own is not a second kind of scorer: it is
mapped over the candidates of each group, in order, by the same runtime path that runs
comparative group scorers (`scorers.base.score_checked`). The lifted scorer accepts
groups of any size and items without a group (each its own group). It declares itself
`per_candidate`: a group may be scored in parts (a stream's windows, OpenRLHF's one sample per
call), so `context.size` counts the group's candidates in this call, not the whole group's.
"""

from __future__ import annotations

import inspect
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from scorers.base import ScoreItem, Scorer, ScorerContractError, ScoreResult, ScorerSpec
from scorers.groups import GroupContext
from scorers.identity import jsonable


@dataclass(frozen=True)
class Verdict:
    """A candidate's score plus the declared diagnostics it counts (a malformed answer, no
    answer)."""

    value: float | Mapping[str, float]
    counts: Mapping[str, int] = field(default_factory=dict)


CandidateFn = Callable[..., float | Mapping[str, float] | Verdict]


def map_candidates(
    fn: CandidateFn,
    *,
    name: str,
    terms: Sequence[str] = (),
    input_kind: str = "text",
    revision: str = "1",
    required_fields: Sequence[str] = (),
    identity: Any = None,
    env: str = "image",
    diagnostics: Sequence[str] = (),
    check_params: Callable[..., None] | None = None,
) -> type[Scorer]:
    """A Scorer class that scores each candidate as `fn(candidate, context, **params)`.

    `fn` returns a float (one term, named `name` unless `terms` says otherwise), a mapping
    with every declared term, or a `Verdict` that also counts declared `diagnostics` (summed
    over the group). Params given to the class go to `fn` and count in its identity;
    `check_params(**params)` refuses bad ones (a regex that does not compile) at construction.
    """
    spec = ScorerSpec(
        name=name,
        input_kind=input_kind,
        required_fields=tuple(required_fields),
        terms=tuple(terms),
        revision=revision,
        env=env,
        identity=identity,
        diagnostics=tuple(diagnostics),
        groupwise=True,
        ragged_groups=True,
        per_candidate=True,
    )

    class Mapped(_MappedScorer):
        __doc__ = fn.__doc__

    Mapped.spec = spec
    Mapped.per_candidate = _PerCandidate(
        fn, inspect.signature(fn), check_params, name, spec.term_names()
    )
    # named after the scorer (token_f1 -> TokenF1): its `module:Class` path is where it is assigned
    Mapped.__name__ = Mapped.__qualname__ = "".join(
        part[:1].upper() + part[1:] for part in name.split("_")
    )
    Mapped.__module__ = getattr(fn, "__module__", __name__)
    return Mapped


@dataclass(frozen=True)
class _PerCandidate:
    """What one `map_candidates` class maps: the function, how its params are checked, its terms."""

    fn: CandidateFn
    signature: inspect.Signature
    check_params: Callable[..., None] | None
    name: str
    term_names: tuple[str, ...]


class _MappedScorer(Scorer):
    """The group scorer every `map_candidates` class is: `per_candidate.fn` over each group, in
    order."""

    per_candidate: ClassVar[_PerCandidate]

    def __init__(self, **params: Any) -> None:
        how = self.per_candidate
        try:
            how.signature.bind(None, None, **params)
        except TypeError as exc:
            raise TypeError(f"{how.name}: {exc}") from exc
        if how.check_params is not None:
            how.check_params(**params)
        self.params = params

    def identity_params(self, params: Mapping[str, Any]) -> dict[str, Any]:
        return _fn_defaults(self.per_candidate.signature, params)

    def score_group(self, candidates: Sequence[ScoreItem], context: GroupContext) -> ScoreResult:
        how = self.per_candidate
        scores: dict[str, list[float]] = {term: [] for term in how.term_names}
        counts: Counter[str] = Counter({diagnostic: 0 for diagnostic in self.spec.diagnostics})
        for candidate in candidates:
            value = how.fn(candidate, context, **self.params)
            if isinstance(value, Verdict):
                counts.update(value.counts)  # undeclared names are refused by score_checked
                value = value.value
            if isinstance(value, Mapping):
                if set(value) != set(how.term_names):
                    raise ScorerContractError(
                        f"{how.name}: candidate {candidate.id!r} got terms {sorted(value)}, "
                        f"declared {list(how.term_names)}"
                    )
                for term in how.term_names:
                    scores[term].append(value[term])
            elif len(how.term_names) == 1:
                scores[how.term_names[0]].append(value)
            else:
                raise ScorerContractError(
                    f"{how.name}: declares terms {list(how.term_names)}; return a mapping of them"
                )
        return ScoreResult(terms=scores, diagnostics=dict(counts))


def _fn_defaults(signature: inspect.Signature, params: Mapping[str, Any]) -> dict[str, Any]:
    """The function's keyword defaults, so passing a default explicitly leaves the identity
    alone."""
    defaults = {
        name: p.default
        for name, p in list(signature.parameters.items())[2:]
        if p.default is not inspect.Parameter.empty and p.kind is not inspect.Parameter.VAR_KEYWORD
    }
    return {name: jsonable(value) for name, value in {**defaults, **params}.items()}
