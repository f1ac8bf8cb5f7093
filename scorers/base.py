"""The scorer authoring contract, shared by in-process and managed execution.

A scorer turns a batch of `ScoreItem`s into one finite float per item for each
of its terms. Everything here is stdlib + numpy so any scorer env can import it
through the import root the parent gives it, without installing managed-scorers.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np


class ScorerContractError(RuntimeError):
    """A scorer returned something other than one finite score per item."""


class ScoreInputError(ValueError):
    """An item lacks what the scorer needs (answered 4xx by the child)."""


@dataclass(frozen=True)
class ScorerSpec:
    """What a scorer is and what it needs; read before any weights load."""

    name: str
    input_kind: str
    required_fields: tuple[str, ...] = ()
    terms: tuple[str, ...] = ()
    revision: str = "1"
    env: str = "image"
    supports_offload: bool = False
    report_packages: tuple[str, ...] = ()  # distributions whose versions /health reports
    # Media arrive as read-only views (zero-copy from the wire or the shared segment);
    # a scorer that writes into its input arrays sets this and gets private copies.
    writable_inputs: bool = False

    def term_names(self) -> tuple[str, ...]:
        return self.terms or (self.name,)


@dataclass
class ScoreItem:
    """One rollout as a scorer sees it (decoded from the wire or built locally)."""

    id: str
    group_id: str | None = None
    prompt: str | None = None
    text: str | None = None
    image: np.ndarray | None = None  # uint8 HWC
    video: np.ndarray | None = None  # uint8 THWC
    reference: Any = None
    metadata: dict[str, Any] = field(default_factory=dict)

    def required_text(self) -> str:
        """The text, which the scorer declared it needs (checked before `score` runs)."""
        return self._required("text", self.text)

    def required_image(self) -> np.ndarray:
        return self._required("image", self.image)

    def required_video(self) -> np.ndarray:
        return self._required("video", self.video)

    def _required(self, name: str, value: Any) -> Any:
        if value is None:
            raise ScoreInputError(f"item {self.id!r}: field {name!r} is required")
        return value


@dataclass
class ScoreResult:
    """Per-term scores in item order, plus diagnostics (counts, timings)."""

    terms: dict[str, list[float]]
    diagnostics: dict[str, Any] = field(default_factory=dict)


class Scorer:
    """Base class: cheap constructor, weights in `load`, scoring in `score`.

    `score` gets media as read-only views that are valid only until it returns (in a
    managed child they live in the shared segment the next request reuses): copy any
    array you keep across calls, or declare `writable_inputs` to get private copies.
    """

    spec: ScorerSpec  # a class attribute, or set per instance by wrappers (video)

    def __init__(self, **params: Any) -> None:
        if params:
            raise TypeError(f"{type(self).__name__} takes no params, got {sorted(params)}")

    def load(self, device: str = "cpu") -> None:
        """Load weights / start helpers. Called once before the first score."""

    def onload(self) -> dict[str, Any]:
        return {}

    def offload(self) -> dict[str, Any]:
        return {}

    def score(self, items: Sequence[ScoreItem]) -> ScoreResult:
        raise NotImplementedError

    def close(self) -> None:
        """Release helpers (processes, memory). Must be bounded and idempotent."""


def check_required_fields(spec: ScorerSpec, items: Sequence[ScoreItem]) -> None:
    """Refuse items missing a field the scorer declared it needs."""
    for index, item in enumerate(items):
        for name in spec.required_fields:
            if getattr(item, name) is None:
                raise ScoreInputError(
                    f"items[{index}] (id={item.id!r}): field {name!r} is required by scorer {spec.name!r}"
                )


def score_checked(scorer: Scorer, items: Sequence[ScoreItem]) -> ScoreResult:
    """Run `scorer.score` and enforce the contract: every term, one finite float per item."""
    check_required_fields(scorer.spec, items)
    result = scorer.score(items)
    if not isinstance(result, ScoreResult):
        raise ScorerContractError(f"scorer {scorer.spec.name!r} returned {type(result).__name__}, expected ScoreResult")
    expected = set(scorer.spec.term_names())
    if set(result.terms) != expected:
        raise ScorerContractError(
            f"scorer {scorer.spec.name!r} returned terms {sorted(result.terms)}, declared {sorted(expected)}"
        )
    for term, values in result.terms.items():
        if len(values) != len(items):
            raise ScorerContractError(
                f"scorer {scorer.spec.name!r} term {term!r}: {len(values)} scores for {len(items)} items"
            )
        for index, value in enumerate(values):
            if not isinstance(value, (int, float, np.floating, np.integer)) or not math.isfinite(value):
                raise ScorerContractError(
                    f"scorer {scorer.spec.name!r} term {term!r}: non-finite score {value!r} "
                    f"for items[{index}] (id={items[index].id!r})"
                )
        result.terms[term] = [float(v) for v in values]
    try:
        json.dumps(result.diagnostics, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ScorerContractError(
            f"scorer {scorer.spec.name!r} diagnostics must be finite JSON (numbers, strings, lists, objects): {exc}"
        ) from exc
    return result


def reference_answer(reference: Any) -> str | None:
    """A gold answer from an opaque reference: a string, or a mapping with 'answer'."""
    if reference is None:
        return None
    if isinstance(reference, str):
        return reference
    if isinstance(reference, (int, float)) and not isinstance(reference, bool):
        return repr(reference)
    if isinstance(reference, Mapping):
        for key in ("answer", "ground_truth", "target"):
            if key in reference:
                return reference_answer(reference[key])
    raise ScoreInputError(
        "reference must be a string, a number, or an object with 'answer', 'ground_truth' or 'target'"
    )
