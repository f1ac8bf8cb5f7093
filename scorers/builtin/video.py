"""video: any image scorer applied to sampled frames of a THWC clip, reduced per clip."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from scorers.base import ScoreInputError, ScoreItem, ScoreResult, ScorerSpec, score_checked
from scorers.wrapping import WrappingScorer

REDUCTIONS: dict[str, Callable[[np.ndarray], Any]] = {"mean": np.mean, "min": np.min, "max": np.max}


def frame_indices(num_frames: int, frames: int | None, stride: int | None) -> list[int]:
    """`frames` evenly spaced indices (ends included), or every `stride`-th frame from 0."""
    if stride is not None:
        return list(range(0, num_frames, stride))
    if frames is None:
        raise ValueError("give frames or stride")
    picks = np.linspace(0, num_frames - 1, num=min(frames, num_frames)).round().astype(int)
    return sorted(set(picks.tolist()))


class VideoScorer(WrappingScorer):
    """Wraps an image scorer by name; its spec (env, offload support) follows the inner one."""

    spec = ScorerSpec(
        name="video",
        input_kind="video",
        required_fields=("video",),
        terms=("video",),
        diagnostics=("frames_scored",),
    )  # per instance

    def __init__(
        self,
        inner: str,
        inner_params: dict[str, Any] | None = None,
        frames: int | None = None,
        stride: int | None = None,
        reduce: str = "mean",
    ) -> None:
        if frames is not None and stride is not None:
            raise ValueError("video: give frames or stride, not both")
        for name, value in (("frames", frames), ("stride", stride)):
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or value < 1
            ):
                raise ValueError(f"video: {name} must be a positive int, got {value!r}")
        if reduce not in REDUCTIONS:
            raise ValueError(f"video: reduce must be one of {sorted(REDUCTIONS)}, got {reduce!r}")
        super().__init__(inner, inner_params)
        if self.inner.spec.input_kind != "image":
            raise ValueError(
                f"video: inner scorer {inner!r} takes {self.inner.spec.input_kind!r}, not 'image'"
            )
        # reducing one term would silently drop the others
        if len(self.inner.spec.term_names()) != 1:
            raise ValueError(
                f"video: inner scorer {inner!r} has terms {self.inner.spec.term_names()}; "
                f"wrap a single-term scorer"
            )
        self.frames = frames if frames is not None or stride is not None else 8
        self.stride = stride
        self.reduce = reduce
        inner_spec = self.inner.spec
        extra = tuple(f for f in inner_spec.required_fields if f != "image")
        self.spec = self.wrapped_spec(
            name="video",
            revision_prefix="video",
            input_kind="video",
            required_fields=("video", *extra),
            terms=("video",),
            diagnostics=("frames_scored",),
        )

    def score(self, items: Sequence[ScoreItem]) -> ScoreResult:
        frame_items, owners = [], []
        for index, item in enumerate(items):
            video = item.required_video()
            if video.shape[0] == 0:
                raise ScoreInputError(f"items[{index}] (id={item.id!r}): video has no frames")
            for t in frame_indices(video.shape[0], self.frames, self.stride):
                frame_items.append(replace(item, id=f"{item.id}#{t}", image=video[t], video=None))
                owners.append(index)
        result = score_checked(self.inner, frame_items)  # one batch: all frames of all clips
        (per_frame,) = (np.asarray(values, dtype=np.float64) for values in result.terms.values())
        owners_arr = np.asarray(owners)
        values = [
            float(REDUCTIONS[self.reduce](per_frame[owners_arr == i])) for i in range(len(items))
        ]
        return ScoreResult(terms={"video": values}, diagnostics={"frames_scored": len(frame_items)})
