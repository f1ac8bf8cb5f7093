"""One response from a scorer's terms: the weighted reward, each term's values and failures.

Every leaf backend ends here: the chunking engine (`supervisor.chunks`) for those that cut a
request into chunks, the job backend for the items it pulled one by one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from supervisor.errors import ScorerTermsFailed
from supervisor.types import SCORER_TERM_FAILED, RewardResponse


def terms_failed(
    scorer: str, term_failed: Mapping[str, Mapping[str, str]], response: RewardResponse
) -> ScorerTermsFailed:
    """The error for terms a scorer failed alone for some items; `response` keeps every item's other
    terms."""
    whys = {
        item_id: f"term {name!r}: {why}"
        for name, failed in term_failed.items()
        for item_id, why in failed.items()
    }
    listed = "; ".join(f"{item_id!r}: {why}" for item_id, why in list(whys.items())[:8])
    more = f"; and {len(whys) - 8} more" if len(whys) > 8 else ""
    return ScorerTermsFailed(
        f"scorer {scorer!r} failed terms {sorted(term_failed)} for {len(whys)} items: "
        f"{listed}{more}",
        whys,
        response,
    )


def assemble_response(
    ids: list[str],
    terms: Mapping[str, np.ndarray],
    required: Sequence[str],
    weights: Mapping[str, float],
    diagnostics: Mapping[str, Any],
    identity_hash: str | None = None,
    term_failed: Mapping[str, Mapping[str, str]] | None = None,
    not_applicable: Mapping[str, set[str] | frozenset[str]] | None = None,
    details: Mapping[str, Mapping[str, Any]] | None = None,
) -> RewardResponse:
    """final = sum(weight * term) over the required terms; every item a success or we raised. A term
    the scorer says failed alone for an item (`term_failed`) is that item's TermFailure: no value
    (None), the item not a success. For a term of the reward, of kind SCORER_TERM_FAILED: the item's
    reward is not usable (the caller raises); for another term (a served panel's optional
    component), of kind term_failed: the reward stands without it. A term that does not apply to an
    item (`not_applicable`, a served panel's term limited to some data sources) is None there, and
    `applicable` says so; a term of the reward always applies (the answer was checked for it).
    `details`: what each scorer says of the items (`details_of`), reporting only."""
    alone = {
        name: [item_id in whys for item_id in ids] for name, whys in (term_failed or {}).items()
    }
    applicable = {
        name: [i not in where for i in ids] for name, where in (not_applicable or {}).items()
    }
    return RewardResponse.checked(  # a weighted sum that overflows is caught there
        ids=ids,
        rewards=_weighted_rewards(ids, terms, required, weights, alone).tolist(),
        component_rewards=_component_rewards(terms, alone, applicable),
        applicable={name: mask for name, mask in applicable.items() if name in terms},
        term_failures=_term_failures(ids, required, term_failed or {}),
        diagnostics=dict(diagnostics),
        details={name: dict(said) for name, said in (details or {}).items()},
        identity_hash=identity_hash,
    )


def details_of(
    scorer: str, ids: Sequence[str], said: Mapping[str, Any]
) -> dict[str, dict[str, Any]]:
    """A response's `details` ({scorer: {id: details}}) for the `ids` it holds: none where the
    scorer said nothing of them."""
    kept = {item_id: said[item_id] for item_id in ids if item_id in said}
    return {scorer: kept} if kept else {}


def _weighted_rewards(
    ids: list[str],
    terms: Mapping[str, np.ndarray],
    required: Sequence[str],
    weights: Mapping[str, float],
    alone: Mapping[str, list[bool]],
) -> np.ndarray:
    """sum(weight * term) over the required terms, a term failed alone for an item counting 0."""
    rewards = np.zeros(len(ids), dtype=np.float64)
    for term in required:
        values = np.asarray(terms[term], dtype=np.float64)
        rewards += weights.get(term, 1.0) * np.where(alone.get(term, False), 0.0, values)
    return rewards


def _term_failures(
    ids: list[str], required: Sequence[str], term_failed: Mapping[str, Mapping[str, str]]
) -> list[dict[str, Any]]:
    """One failure per term and distinct reason, with the items that failed so, in item order."""
    return [
        {
            "term": name,
            "ids": [i for i in ids if whys.get(i) == why],
            "error": why,
            "kind": SCORER_TERM_FAILED if name in required else "term_failed",
        }
        for name, whys in term_failed.items()
        for why in dict.fromkeys(whys[i] for i in ids if i in whys)
    ]


def _component_rewards(
    terms: Mapping[str, np.ndarray],
    alone: Mapping[str, list[bool]],
    applicable: Mapping[str, list[bool]],
) -> dict[str, list[float | None]]:
    """Each term's values, None where it failed alone for the item or does not apply to it."""
    return {
        name: [
            None
            if (name in alone and alone[name][i])
            or (name in applicable and not applicable[name][i])
            else float(v)
            for i, v in enumerate(values)
        ]
        for name, values in terms.items()
    }
