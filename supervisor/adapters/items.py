"""Items built from a framework's call, in one place: what the framework hands over becomes a
RewardItem or a typed error naming the item, never a raw pydantic or TypeError.

Frameworks pass what their datasets hold: verl's parquet rows give numpy arrays and scalars
(a list of accepted answers is a numpy array of strings), which are plain JSON values here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from supervisor.errors import ScorerRequestError, validation_message
from supervisor.types import RewardItem, RewardRequest


def plain(value: Any) -> Any:
    """numpy arrays and scalars (nested in lists and mappings too) as the JSON values they hold."""
    if isinstance(value, np.ndarray):
        return plain(value.tolist())
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, Mapping):
        return {key: plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(item) for item in value]
    return value


def item(where: str, **fields: Any) -> RewardItem:
    """A RewardItem, or ScorerRequestError (bad_input) saying which item and what is wrong with
    it."""
    if "reference" in fields:
        fields["reference"] = plain(fields["reference"])
    try:
        return RewardItem(**fields)
    except ValueError as exc:  # pydantic's ValidationError
        raise ScorerRequestError(f"{where}: {validation_message(exc)}", kind="bad_input") from exc


def request(
    what: str, items: list[RewardItem], group_size: int | None = None, step: int | None = None
) -> RewardRequest:
    if not items:
        raise ScorerRequestError(
            f"{what} was called with no items: nothing to score", kind="bad_input"
        )
    return RewardRequest(items=items, group_size=group_size, step=step)
