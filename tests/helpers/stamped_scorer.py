"""A scorer whose verdict and identity come from a file on its node, read at start-up: what a node's
scorer env updated between two starts of a child looks like (tests/trainers/test_ray_pool.py,
bench/hardening_ray.py). Loaded in real children by dotted path."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from scorers.base import ScoreItem, Scorer, ScoreResult, ScorerSpec


class Stamped(Scorer):
    """Every item scores the number in `stamp_file`, which is also in the identity hash. An item
    whose text is 'hang' makes its call touch `hang_mark` (when given), then sleep `hang_s`."""

    spec = ScorerSpec(name="stamped", input_kind="text", terms=("stamped",), env="image")

    def __init__(self, stamp_file: str, hang_s: float = 0.0, hang_mark: str | None = None) -> None:
        self.stamp = float(Path(stamp_file).read_text())
        self.hang_s, self.hang_mark = hang_s, hang_mark

    def identity_params(self, params: Mapping[str, Any]) -> dict[str, Any]:
        return {**super().identity_params(params), "stamp": self.stamp}

    def score(self, items: Sequence[ScoreItem]) -> ScoreResult:
        if any(item.text == "hang" for item in items):
            if self.hang_mark is not None:
                Path(self.hang_mark).touch()
            time.sleep(self.hang_s)
        return ScoreResult(terms={"stamped": [self.stamp] * len(items)})
