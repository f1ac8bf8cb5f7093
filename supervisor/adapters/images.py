"""Generated images as trainers hand them over -> uint8 HWC, the way a scorer receives them.

DDPO and flow-GRPO give float NCHW tensors in [0, 1] (a VAE decode), others [-1, 1]; the
caller declares the range (`zero_one` or `neg_one_to_one`), never guessed from the data.
The values must be finite and in range up to `tolerance` (a decoder overshoots a little;
more than that is a bug upstream, refused naming the image). One exact fp32 transform:
clamp to the range, scale to [0, 255], round half up, cast. uint8 input passes as is.
Torch CPU tensors are read through numpy without a copy.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import numpy as np

from supervisor.errors import ScorerRequestError
from supervisor.tensors import numpy_view

OutputRange = Literal["zero_one", "neg_one_to_one"]
Layout = Literal["NCHW", "NHWC"]
RANGES: dict[str, tuple[float, float]] = {"zero_one": (0.0, 1.0), "neg_one_to_one": (-1.0, 1.0)}


def as_numpy(value: Any) -> np.ndarray:
    """A numpy view of an array or a torch CPU tensor (no copy); anything else is refused."""
    try:
        array = numpy_view(value)
    except ValueError as exc:
        raise ScorerRequestError(f"images: {exc}", kind="bad_input") from exc
    if not isinstance(array, np.ndarray):
        raise ScorerRequestError(
            f"images must be a numpy array or a torch tensor, got {type(value).__name__}", kind="bad_input"
        )
    return array


def to_uint8_hwc(
    images: Any,
    output_range: OutputRange,
    layout: Layout = "NCHW",
    tolerance: float = 1e-3,
    allocate: Callable[[tuple[int, ...]], np.ndarray] | None = None,
) -> np.ndarray:
    """N images -> uint8 (N, H, W, C), written into `allocate(shape)` (e.g. a backend's arena)."""
    if output_range not in RANGES:
        raise ValueError(f"output_range must be one of {sorted(RANGES)}, got {output_range!r}")
    if layout not in ("NCHW", "NHWC"):
        raise ValueError(f"layout must be NCHW or NHWC, got {layout!r}")
    array = as_numpy(images)
    if array.ndim != 4:
        raise ScorerRequestError(f"images must be a batch of shape {layout}, got {list(array.shape)}", kind="bad_input")
    hwc = array.transpose(0, 2, 3, 1) if layout == "NCHW" else array
    if hwc.shape[-1] not in (1, 3, 4):
        raise ScorerRequestError(
            f"images in {layout} have {hwc.shape[-1]} channels (1, 3 or 4 expected): is the layout right?",
            kind="bad_input",
        )
    out = allocate(hwc.shape) if allocate is not None else np.empty(hwc.shape, np.uint8)
    if hwc.dtype == np.uint8:
        out[...] = hwc
        return out
    if not np.issubdtype(hwc.dtype, np.floating):
        raise ScorerRequestError(f"images must be float or uint8, got {hwc.dtype}", kind="bad_input")
    low, high = RANGES[output_range]
    values = hwc.astype(np.float32, copy=False)
    for index in range(values.shape[0]):
        image = values[index]
        if not np.isfinite(image).all():
            raise ScorerRequestError(f"image {index} has non-finite values", kind="bad_input")
        lo, hi = float(image.min()), float(image.max())
        slack = tolerance * (high - low)
        if lo < low - slack or hi > high + slack:
            raise ScorerRequestError(
                f"image {index} spans [{lo:.4g}, {hi:.4g}], outside the declared {output_range} range "
                f"[{low}, {high}] (tolerance {tolerance})",
                kind="bad_input",
            )
        scaled = (np.clip(image, np.float32(low), np.float32(high)) - np.float32(low)) * np.float32(
            255.0 / (high - low)
        )
        out[index] = np.floor(scaled + np.float32(0.5)).astype(np.uint8)
    return out
