"""Responses of several backends (replicas, servers, a Ray pool's actors) or ranks, joined by item
id into one response; and the errors of the shares, joined the same way wherever a request was
split."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from scorers.diagnostics import merge_term_reports
from supervisor.errors import RewardContractError, ScorerItemsFailed, ScorerTermsFailed
from supervisor.outcome import Outcome
from supervisor.types import RewardResponse


def items_failed(
    scorer: str, total: int, failed: Mapping[str, str], partial: RewardResponse
) -> ScorerItemsFailed:
    """The error for items a scorer could not score, each named with why; `partial` holds the
    rest."""
    listed = "; ".join(f"{item_id!r}: {why}" for item_id, why in list(failed.items())[:8])
    more = f"; and {len(failed) - 8} more" if len(failed) > 8 else ""
    return ScorerItemsFailed(
        f"scorer {scorer!r} could not score {len(failed)} of {total} items: {listed}{more}",
        kind="items_failed",
        failed=dict(failed),
        partial=partial,
    )


def rows_by_id(responses: Sequence[RewardResponse]) -> dict[str, tuple[RewardResponse, int]]:
    """Where each id's row is: (the response that scored it, its index there)."""
    return {
        item_id: (response, index)
        for response in responses
        for index, item_id in enumerate(response.ids)
    }


def join_rows(
    ids: list[str], rows: Mapping[str, tuple[RewardResponse, int]], diagnostics: dict[str, Any]
) -> RewardResponse:
    """The rows of `ids`, taken from the responses that scored them."""
    sources = [rows[item_id] for item_id in ids]
    terms = list(sources[0][0].component_rewards)
    for response, _ in sources:
        if list(response.component_rewards) != terms:
            raise RewardContractError(
                f"the responses joined have different terms: {terms} and "
                f"{list(response.component_rewards)}"
            )
    masks = list(sources[0][0].applicable)
    details: dict[str, dict[str, Any]] = {}
    for item_id, (response, _) in zip(ids, sources, strict=True):
        for name, said in response.details.items():
            if item_id in said:
                details.setdefault(name, {})[item_id] = said[item_id]
    failures: dict[tuple[str, str, str], list[str]] = {}
    for item_id, (response, _) in zip(ids, sources, strict=True):
        for failure in response.term_failures:
            if item_id in failure.ids:
                failures.setdefault((failure.term, failure.error, failure.kind), []).append(item_id)
    # each row keeps its own success and error, as its backend stated them
    return RewardResponse.checked(
        ids=ids,
        rewards=[r.rewards[i] for r, i in sources],
        component_rewards={t: [r.component_rewards[t][i] for r, i in sources] for t in terms},
        successes=[r.successes[i] for r, i in sources],
        errors=[r.errors[i] for r, i in sources],
        applicable={
            t: [r.applicable[t][i] if t in r.applicable else True for r, i in sources]
            for t in masks
        },
        term_failures=[
            {"term": term, "ids": failed, "error": error, "kind": kind}
            for (term, error, kind), failed in failures.items()
        ],
        diagnostics=diagnostics,
        details=details,
        identity_hash=sources[0][0].identity_hash,
    )


def shares_failed(scorer: str, ids: list[str], outcomes: Sequence[Outcome]) -> Outcome | None:
    """The one outcome of a split request whose failed shares each failed only some items (their
    partials joined) or only some terms (their responses joined), as one backend's would be; None
    when no share failed, or one failed otherwise (the caller names that share)."""
    kinds = {outcome.kind for outcome in outcomes if not outcome.ok}
    if kinds == {"terms_failed"}:
        return _join_term_failures(scorer, ids, outcomes)
    if kinds == {"items_failed"}:
        return _join_item_failures(scorer, ids, outcomes)
    return None


def _gathered(outcomes: Sequence[Outcome]) -> tuple[dict[str, str], list[RewardResponse]]:
    """The failed ids of every share, and every share's response (a failed share's partial)."""
    failed: dict[str, str] = {}
    for outcome in outcomes:
        failed.update(outcome.failed)
    return failed, [outcome.response for outcome in outcomes if outcome.response is not None]


def _join_item_failures(scorer: str, ids: list[str], outcomes: Sequence[Outcome]) -> Outcome:
    failed, responses = _gathered(outcomes)
    kept = [item_id for item_id in ids if item_id not in failed]
    diagnostics = merge_term_reports(r.diagnostics for r in responses)
    # every item failed: each partial is empty, and any of them has the terms an empty response
    # needs
    partial = (
        join_rows(kept, rows_by_id(responses), diagnostics)
        if kept
        else responses[0].model_copy(update={"diagnostics": diagnostics})
    )
    return Outcome.items_failed(items_failed(scorer, len(ids), failed, partial), partial)


def _join_term_failures(scorer: str, ids: list[str], outcomes: Sequence[Outcome]) -> Outcome:
    failed, responses = _gathered(outcomes)
    joined = join_rows(
        ids, rows_by_id(responses), merge_term_reports(r.diagnostics for r in responses)
    )
    first_id, why = next(iter(failed.items()))
    error = ScorerTermsFailed(
        f"scorer {scorer!r} failed terms for {len(failed)} items: {first_id!r}: {why}",
        failed,
        joined,
    )
    return Outcome.terms_failed(error, joined)


def join_shares(
    scorer: str,
    ids: list[str],
    outcomes: Sequence[Outcome],
    named: Callable[[int, BaseException, int], BaseException],
) -> Outcome:
    """The outcome of a request split in shares (over replicas, servers, a pool's actors): their
    responses joined by id; their item or term failures joined (`shares_failed`); or the first
    share's failure, as `named(index, error, how many others failed)` names it."""
    joined = shares_failed(scorer, ids, outcomes)
    if joined is not None:
        return joined
    failed = [
        (index, outcome.error)
        for index, outcome in enumerate(outcomes)
        if outcome.error is not None
    ]
    if failed:
        index, error = failed[0]
        named_error = named(index, error, len(failed) - 1)
        if named_error is not error:
            named_error.__cause__ = error  # as `raise named from error`
        return Outcome.raised(named_error)
    responses = [outcome.response for outcome in outcomes if outcome.response is not None]
    return Outcome.scored(
        join_rows(ids, rows_by_id(responses), merge_term_reports(r.diagnostics for r in responses))
    )
