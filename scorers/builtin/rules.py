"""Rule rewards that need no model: exact match, non-empty, constant, mean intensity, token F1."""

from __future__ import annotations

import math
import re
import unicodedata
from collections import Counter
from collections.abc import Sequence

import numpy as np

from scorers.base import (
    ScoreInputError,
    ScoreItem,
    Scorer,
    ScoreResult,
    ScorerSpec,
    reference_answer,
)
from scorers.groups import GroupContext
from scorers.pointwise import map_candidates

_SPACE = re.compile(r"\s+")


def normalize_text(text: str, case_sensitive: bool) -> str:
    """NFKC, collapse whitespace, strip; lowercase unless case-sensitive."""
    text = _SPACE.sub(" ", unicodedata.normalize("NFKC", text)).strip()
    return text if case_sensitive else text.casefold()


def _gold(item: ScoreItem) -> str:
    gold = reference_answer(item.reference)
    if gold is None:
        raise ScoreInputError(f"item {item.id!r}: exact_match needs a reference answer")
    return gold


class ExactMatch(Scorer):
    """1.0 when the completion equals the reference answer after normalisation."""

    spec = ScorerSpec(
        name="exact_match",
        input_kind="text",
        required_fields=("text", "reference"),
        terms=("exact_match",),
        revision="1",
        env="image",
    )

    def __init__(self, case_sensitive: bool = False) -> None:
        if not isinstance(case_sensitive, bool):
            raise TypeError("case_sensitive must be a bool")
        self.case_sensitive = case_sensitive

    def score(self, items: Sequence[ScoreItem]) -> ScoreResult:
        values = [
            float(
                normalize_text(item.required_text(), self.case_sensitive)
                == normalize_text(_gold(item), self.case_sensitive)
            )
            for item in items
        ]
        return ScoreResult(terms={"exact_match": values})


class NonEmpty(Scorer):
    """1.0 when the completion has any non-whitespace text."""

    spec = ScorerSpec(
        name="nonempty",
        input_kind="text",
        required_fields=("text",),
        terms=("nonempty",),
        revision="1",
        env="image",
    )

    def score(self, items: Sequence[ScoreItem]) -> ScoreResult:
        return ScoreResult(
            terms={"nonempty": [float(bool(item.required_text().strip())) for item in items]}
        )


class Constant(Scorer):
    """The same finite value for every item: a baseline and a plumbing probe."""

    spec = ScorerSpec(
        name="constant", input_kind="text", terms=("constant",), revision="1", env="image"
    )

    def __init__(self, value: float = 1.0) -> None:
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not math.isfinite(value)
        ):
            raise ValueError(f"value must be a finite number, got {value!r}")
        self.value = float(value)

    def score(self, items: Sequence[ScoreItem]) -> ScoreResult:
        return ScoreResult(terms={"constant": [self.value] * len(items)})


class MeanIntensity(Scorer):
    """Mean pixel value in [0, 1] (brightness): a cheap image reward, and the transport bench's
    load.

    Scoring costs one pass over the pixels, so managed vs in-process on it measures the data plane.
    """

    spec = ScorerSpec(
        name="mean_intensity",
        input_kind="image",
        required_fields=("image",),
        terms=("mean_intensity",),
        revision="1",
        env="image",
    )

    def score(self, items: Sequence[ScoreItem]) -> ScoreResult:
        return ScoreResult(
            terms={
                "mean_intensity": [
                    float(item.required_image().mean(dtype=np.float64)) / 255.0 for item in items
                ]
            }
        )


def _tokens(text: str) -> list[str]:
    return normalize_text(text, case_sensitive=False).split()


def token_f1(candidate: ScoreItem, context: GroupContext) -> float:
    """SQuAD-style token F1 between the completion and the reference answer (bag of tokens)."""
    gold = reference_answer(context.reference)
    if gold is None:
        raise ScoreInputError(f"item {candidate.id!r}: token_f1 needs a reference answer")
    predicted, expected = Counter(_tokens(candidate.required_text())), Counter(_tokens(gold))
    common = sum((predicted & expected).values())
    if common == 0:
        return 0.0
    precision, recall = common / sum(predicted.values()), common / sum(expected.values())
    return 2 * precision * recall / (precision + recall)


TokenF1 = map_candidates(token_f1, name="token_f1", required_fields=("text", "reference"))
