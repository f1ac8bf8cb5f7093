"""Responses of several backends (replicas) or ranks, joined by item id into one response."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from supervisor.errors import RewardContractError
from supervisor.types import RewardResponse


def rows_by_id(responses: Sequence[RewardResponse]) -> dict[str, tuple[RewardResponse, int]]:
    """Where each id's row is: (the response that scored it, its index there)."""
    return {item_id: (response, index) for response in responses for index, item_id in enumerate(response.ids)}


def join_rows(
    ids: list[str], rows: Mapping[str, tuple[RewardResponse, int]], diagnostics: dict[str, Any]
) -> RewardResponse:
    """The rows of `ids`, taken from the responses that scored them."""
    sources = [rows[item_id] for item_id in ids]
    terms = list(sources[0][0].component_rewards)
    for response, _ in sources:
        if list(response.component_rewards) != terms:
            raise RewardContractError(
                f"the responses joined have different terms: {terms} and {list(response.component_rewards)}"
            )
    masks = list(sources[0][0].applicable)
    failures: dict[tuple[str, str, str], list[str]] = {}
    for item_id, (response, _) in zip(ids, sources, strict=True):
        for failure in response.term_failures:
            if item_id in failure.ids:
                failures.setdefault((failure.term, failure.error, failure.kind), []).append(item_id)
    return RewardResponse.checked(  # each row keeps its own success and error, as its backend stated them
        ids=ids,
        rewards=[r.rewards[i] for r, i in sources],
        component_rewards={t: [r.component_rewards[t][i] for r, i in sources] for t in terms},
        successes=[r.successes[i] for r, i in sources],
        errors=[r.errors[i] for r, i in sources],
        applicable={t: [r.applicable[t][i] if t in r.applicable else True for r, i in sources] for t in masks},
        term_failures=[
            {"term": term, "ids": failed, "error": error, "kind": kind}
            for (term, error, kind), failed in failures.items()
        ],
        diagnostics=diagnostics,
        identity_hash=sources[0][0].identity_hash,
    )
