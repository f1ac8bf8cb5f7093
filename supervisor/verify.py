"""What crosses to a scorer server and back: a chunk's request frame, and the checks on every answer
before a reward may reach a sample."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from child_runtime.protocol import wire
from scorers.details import DetailsError, check_detail
from scorers.diagnostics import DiagnosticsError, check_values
from supervisor.chunks import ChunkAnswer
from supervisor.errors import ChildRecord, RewardContractError, ScorerRequestError
from supervisor.shape import ScorerShape
from supervisor.types import RewardItem


def encode_chunk(
    chunk: Sequence[RewardItem],
    group_size: int | None,
    max_request_bytes: int | None,
    terms: Sequence[str] | None = None,
) -> wire.Frame:
    """The chunk as a frame, refused before sending what the server would refuse; `terms`: the
    scorer's terms wanted (None: all, and the field is not sent: servers before it refuse it)."""
    meta: dict[str, Any] = {"items": [item.to_wire() for item in chunk]}
    if group_size is not None:
        meta["group_size"] = group_size
    if terms is not None:
        meta["terms"] = list(terms)
    try:
        frame = wire.prepare(meta)
    except wire.WireError as exc:
        raise ScorerRequestError(f"cannot encode request: {exc}", kind="bad_input") from exc
    size = frame.body_size()  # one limit, whichever way the arrays travel
    if max_request_bytes is not None and size > max_request_bytes:
        raise ScorerRequestError(
            f"request of {size} bytes exceeds max_request_bytes={max_request_bytes}; lower "
            f"request_batch_size",
            status=413,
            kind="too_large",
        )
    return frame


def verify_score_answer(
    answer: Any,
    expected_ids: Sequence[str],
    required: Sequence[str],
    record: Callable[[], ChildRecord | None] = lambda: None,
    declared: ScorerShape | None = None,
    asked: Sequence[str] | None = None,
) -> ChunkAnswer:
    """Same ids in the same order, every required term, one finite float64 per item except the
    items the answer names as failed (id -> why) and, per term, those it names in `term_failed` or
    `not_applicable`;
    with the scorer's `declared` shape, exactly its terms (those `asked` for, when the request named
    some) and only its diagnostics (a server redeployed with another scorer, or one that does not
    keep the contract, never fills a reward)."""

    def fail(message: str) -> RewardContractError:
        return RewardContractError(message, record())

    if not isinstance(answer, dict) or not isinstance(answer.get("terms"), dict):
        raise fail("score answer is not an object with 'ids' and 'terms'")
    ids = answer.get("ids")
    if not isinstance(ids, list) or ids != list(expected_ids):
        raise fail(_id_mismatch(ids, expected_ids))
    failed = _failures(answer.get("failed"), "'failed'", expected_ids, fail)
    term_failed = _term_failures(answer, expected_ids, fail)
    not_applicable = _not_applicable(answer, expected_ids, fail)
    terms = _term_values(answer["terms"], expected_ids, failed, term_failed, not_applicable, fail)
    _check_terms_named(terms, required, term_failed, not_applicable, fail)
    diagnostics = answer.get("diagnostics") or {}
    known = declared is not None and bool(declared.terms)
    details = _details(answer, expected_ids, declared if known else None, fail)
    if declared is None or not declared.terms:
        plain = diagnostics if isinstance(diagnostics, dict) else {}
        return ChunkAnswer(terms, plain, failed, term_failed, not_applicable, details)
    checked = _declared_diagnostics(terms, diagnostics, declared, asked, fail)
    return ChunkAnswer(terms, checked, failed, term_failed, not_applicable, details)


def _details(
    answer: dict[str, Any],
    expected_ids: Sequence[str],
    declared: ScorerShape | None,
    fail: Callable[[str], RewardContractError],
) -> dict[str, Any]:
    """The answer's `details` ({id: details}): ids of the request, each a small JSON object over
    the keys the scorer declared (any keys where its shape is not known)."""
    found = answer.get("details") or {}
    if not isinstance(found, dict):
        raise fail(f"answer's 'details' must map ids to objects, got {type(found).__name__}")
    unknown = sorted(set(found) - set(expected_ids))
    if unknown:
        raise fail(f"answer's 'details' names ids {unknown[:5]} that were not in the request")
    scorer = "?" if declared is None else declared.name
    keys = None if declared is None else declared.details
    try:
        return {
            item_id: check_detail(scorer, keys, f"id {item_id!r}", said)
            for item_id, said in found.items()
        }
    except DetailsError as exc:
        raise fail(str(exc)) from exc


def _check_terms_named(
    terms: dict[str, np.ndarray],
    required: Sequence[str],
    term_failed: dict[str, dict[str, str]],
    not_applicable: dict[str, frozenset[str]],
    fail: Callable[[str], RewardContractError],
) -> None:
    """Every required term has values, and so has every term the answer names failures or
    inapplicable items of."""
    missing = [name for name in required if name not in terms]
    if missing:
        raise fail(f"required rewards {missing} missing from the answer (got {sorted(terms)})")
    for what, named in (("failures", term_failed), ("inapplicable items", not_applicable)):
        if set(named) - set(terms):
            raise fail(
                f"answer names {what} of terms {sorted(set(named) - set(terms))} it has no "
                f"values for"
            )


def _declared_diagnostics(
    terms: dict[str, np.ndarray],
    diagnostics: Any,
    declared: ScorerShape,
    asked: Sequence[str] | None,
    fail: Callable[[str], RewardContractError],
) -> dict[str, Any]:
    """The answer's diagnostics, checked against the scorer's `declared` shape, once its terms are
    exactly those declared (or `asked` for)."""
    expected = set(declared.terms) if asked is None else set(asked)
    if set(terms) != expected:
        said = "declared" if asked is None else "was asked for"
        raise fail(
            f"answer has terms {sorted(terms)}; scorer {declared.name!r} {said} {sorted(expected)}"
        )
    try:
        return check_values(declared.name, declared.diagnostics, diagnostics)
    except DiagnosticsError as exc:
        raise fail(str(exc)) from exc


def _term_values(
    given: dict[str, Any],
    expected_ids: Sequence[str],
    failed: dict[str, str],
    term_failed: dict[str, dict[str, str]],
    not_applicable: dict[str, frozenset[str]],
    fail: Callable[[str], RewardContractError],
) -> dict[str, np.ndarray]:
    """Each term's scores: float64, one per item, finite but where the answer says it failed."""
    terms: dict[str, np.ndarray] = {}
    for name, values in given.items():
        if (
            not isinstance(values, np.ndarray)
            or values.dtype != np.float64
            or values.shape != (len(expected_ids),)
        ):
            shape = getattr(values, "shape", type(values).__name__)
            raise fail(f"term {name!r}: expected {len(expected_ids)} float64 scores, got {shape}")
        unscored = (
            failed.keys() | term_failed.get(name, {}).keys() | not_applicable.get(name, frozenset())
        )
        scored = np.array([item_id not in unscored for item_id in expected_ids], dtype=bool)
        bad = np.flatnonzero(~np.isfinite(values) & scored)
        if bad.size:
            index = int(bad[0])
            raise fail(
                f"term {name!r}: non-finite score {values[index]} for id {expected_ids[index]!r}"
            )
        terms[name] = values
    return terms


def _term_failures(
    answer: dict[str, Any], expected_ids: Sequence[str], fail: Callable[[str], RewardContractError]
) -> dict[str, dict[str, str]]:
    """The answer's `term_failed` ({term: {id: why}}), checked like `failed`."""
    found = answer.get("term_failed") or {}
    if not isinstance(found, dict):
        raise fail(f"answer's 'term_failed' must map terms to failed ids, got {found!r}")
    return {
        term: _failures(whys, f"'term_failed'[{term!r}]", expected_ids, fail)
        for term, whys in found.items()
    }


def _not_applicable(
    answer: dict[str, Any],
    expected_ids: Sequence[str],
    fail: Callable[[str], RewardContractError],
) -> dict[str, frozenset[str]]:
    """The answer's `not_applicable` ({term: [ids]}), each id one of the request's (that no term of
    the reward is among them is score_in_chunks' check, for every backend)."""
    found = answer.get("not_applicable") or {}
    if not isinstance(found, dict) or not all(isinstance(ids, list) for ids in found.values()):
        raise fail(f"answer's 'not_applicable' must map terms to lists of ids, got {found!r}")
    known = set(expected_ids)
    for term, ids in found.items():
        unknown = [i for i in ids if i not in known]
        if unknown:
            raise fail(
                f"answer's 'not_applicable'[{term!r}] names ids {unknown[:5]} that were not "
                f"in the request"
            )
    return {term: frozenset(ids) for term, ids in found.items()}


def _failures(
    given: Any, what: str, expected_ids: Sequence[str], fail: Callable[[str], RewardContractError]
) -> dict[str, str]:
    """Failed ids -> why, each id one of the request's."""
    failed = given or {}
    if not isinstance(failed, dict) or not all(
        isinstance(why, str) and why for why in failed.values()
    ):
        raise fail(f"answer's {what} must map ids to reasons, got {failed!r}")
    unknown = sorted(set(failed) - set(expected_ids))
    if unknown:
        raise fail(f"answer's {what} names failed ids {unknown[:5]} that were not in the request")
    return failed


def _id_mismatch(ids: Any, expected: Sequence[str]) -> str:
    if not isinstance(ids, list):
        return f"answer has no id list (got {type(ids).__name__}); ids must be echoed"
    if len(ids) != len(expected):
        return f"answer echoes {len(ids)} ids for {len(expected)} items"
    index = next(i for i, (a, b) in enumerate(zip(ids, expected, strict=True)) if a != b)
    return (
        f"answer for the wrong sample: position {index} echoes id {ids[index]!r}, expected "
        f"{expected[index]!r}"
    )
