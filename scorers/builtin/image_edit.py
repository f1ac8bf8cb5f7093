"""An image-edit reward a reader can check by hand: how much of the source image the edit kept.

`edit_fidelity` = 1 - mean |edit - source| / 255 over every pixel and channel, in [0, 1]: 1.0
for an edit that changed nothing, 0.0 for one that inverted black and white. It needs the
source (one conditioning image of the edit's shape): without it the item is refused, never
scored against nothing. numpy only, so it runs in any scorer env.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from scorers.base import ScoreInputError, ScoreItem, Scorer, ScoreResult, ScorerSpec


def kept_fraction(edit: np.ndarray, source: np.ndarray) -> float:
    """1 - mean absolute difference / 255 of two uint8 images of one shape."""
    if edit.shape != source.shape:
        raise ScoreInputError(
            f"the edit has shape {list(edit.shape)}, its source {list(source.shape)}: not "
            f"comparable"
        )
    difference = np.abs(edit.astype(np.int16) - source.astype(np.int16))
    return 1.0 - float(difference.mean(dtype=np.float64)) / 255.0


class EditFidelity(Scorer):
    """The share of the conditioning image an edit left as it was (a cheap image_edit reward)."""

    spec = ScorerSpec(
        name="edit_fidelity",
        input_kind="image_edit",
        required_fields=("image", "condition_images"),
        terms=("edit_fidelity",),
        revision="1",
        env="image",
    )

    def score(self, items: Sequence[ScoreItem]) -> ScoreResult:
        return ScoreResult(terms={"edit_fidelity": [_item_fidelity(item) for item in items]})


def _item_fidelity(item: ScoreItem) -> float:
    if len(item.condition_images) != 1:
        raise ScoreInputError(
            f"item {item.id!r}: edit_fidelity compares the edit with one source image in "
            f"condition_images, got {len(item.condition_images)}"
        )
    try:
        return kept_fraction(item.required_image(), item.condition_images[0])
    except ScoreInputError as exc:
        raise ScoreInputError(f"item {item.id!r}: {exc}") from exc
