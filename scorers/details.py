"""Per-item details: what a scorer says about one item (a code reward's verdict per test), for
reporting only. The runtime never reads them into a reward.

A scorer declares the keys it may use (`ScorerSpec.details`). An item's details are a JSON object
over those keys, at most `MAX_BYTES` once encoded, so that one chatty scorer cannot swell every
answer. They travel under the item's id and stay with it through chunks, shares and ranks, where
diagnostics (`scorers.diagnostics`) are only counts and means. Stdlib only.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from scorers.diagnostics import check_name

MAX_BYTES = 8192


class DetailsError(ValueError):
    """An item's details that are not a small JSON object over the scorer's declared keys."""


def check_detail(scorer: str, declared: Iterable[str] | None, where: str, detail: Any) -> Any:
    """`detail` as plain JSON (tuples become lists): a mapping over the `declared` keys (None: any
    key, for an answer whose scorer declared nothing we know), finite, at most MAX_BYTES."""
    if not isinstance(detail, Mapping):
        raise DetailsError(
            f"scorer {scorer!r} details of {where} must be a mapping, got {type(detail).__name__}"
        )
    allowed = None if declared is None else set(declared)
    for key in detail:
        check_name(key, f"scorer {scorer!r} details key")
        if allowed is not None and key not in allowed:
            raise DetailsError(
                f"scorer {scorer!r} details of {where}: undeclared key {key!r} (declared: "
                f"{sorted(allowed)})"
            )
    try:
        text = json.dumps(detail, allow_nan=False, ensure_ascii=False, separators=(",", ":"))
        size = len(text.encode("utf-8"))
    except (TypeError, ValueError, RecursionError) as exc:  # UnicodeEncodeError is a ValueError
        raise DetailsError(
            f"scorer {scorer!r} details of {where} are not finite UTF-8 JSON: {exc}"
        ) from exc
    if size > MAX_BYTES:
        raise DetailsError(
            f"scorer {scorer!r} details of {where} take {size} bytes as JSON (limit "
            f"{MAX_BYTES}): keep per-item details short; counts belong in diagnostics"
        )
    return json.loads(text)
