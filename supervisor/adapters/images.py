"""Generated images as trainers hand them over -> uint8 HWC, the way a scorer receives them.

DDPO and flow-GRPO give float NCHW tensors in [0, 1] (a VAE decode), others [-1, 1]; the
caller declares the range (`zero_one` or `neg_one_to_one`), never guessed from the data.
The values must be finite and in range up to `tolerance` (a decoder overshoots a little;
more than that is a bug upstream, refused naming the image). One exact fp32 transform:
clamp to the range, scale to [0, 255], round half up, cast. uint8 input passes as is.
Arrays and torch CPU tensors are read in place (no copy). A tensor numpy cannot view (on an
accelerator, where DDPO and flow-GRPO leave their images, or bfloat16) is checked and
quantised where it lives with the same fp32 arithmetic; only its uint8 result crosses to the
host, straight into the destination array.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import numpy as np

from supervisor.errors import ScorerRequestError
from supervisor.tensors import is_tensor, numpy_view

OutputRange = Literal["zero_one", "neg_one_to_one"]
Layout = Literal["NCHW", "NHWC"]
Allocate = Callable[[tuple[int, ...]], np.ndarray]
RANGES: dict[str, tuple[float, float]] = {"zero_one": (0.0, 1.0), "neg_one_to_one": (-1.0, 1.0)}


def as_numpy(value: Any) -> np.ndarray:
    """A numpy view of an array or a torch CPU tensor (no copy); anything else is refused."""
    try:
        array = numpy_view(value)
    except ValueError as exc:
        raise ScorerRequestError(f"images: {exc}", kind="bad_input") from exc
    if not isinstance(array, np.ndarray):
        raise ScorerRequestError(
            f"images must be a numpy array or a torch tensor, got {type(value).__name__}",
            kind="bad_input",
        )
    return array


def _hwc_shape(shape: tuple[int, ...], layout: Layout) -> tuple[int, ...]:
    if len(shape) != 4:
        raise ScorerRequestError(
            f"images must be a batch of shape {layout}, got {list(shape)}", kind="bad_input"
        )
    hwc = (shape[0], shape[2], shape[3], shape[1]) if layout == "NCHW" else tuple(shape)
    if hwc[-1] not in (1, 3, 4):
        raise ScorerRequestError(
            f"images in {layout} have {hwc[-1]} channels (1, 3 or 4 expected): is the layout "
            f"right?",
            kind="bad_input",
        )
    return hwc


def _check_values(
    index: int, finite: bool, lo: float, hi: float, output_range: str, tolerance: float
) -> None:
    low, high = RANGES[output_range]
    if not finite:
        raise ScorerRequestError(f"image {index} has non-finite values", kind="bad_input")
    slack = tolerance * (high - low)
    if lo < low - slack or hi > high + slack:
        raise ScorerRequestError(
            f"image {index} spans [{lo:.4g}, {hi:.4g}], outside the declared {output_range} range "
            f"[{low}, {high}] (tolerance {tolerance})",
            kind="bad_input",
        )


def _viewable(tensor: Any) -> bool:
    return tensor.device.type == "cpu" and str(tensor.dtype) != "torch.bfloat16"


def to_uint8_hwc(
    images: Any,
    output_range: OutputRange,
    layout: Layout = "NCHW",
    tolerance: float = 1e-3,
    allocate: Allocate | None = None,
) -> np.ndarray:
    """N images -> uint8 (N, H, W, C), written into `allocate(shape)` (e.g. a backend's arena)."""
    if output_range not in RANGES:
        raise ValueError(f"output_range must be one of {sorted(RANGES)}, got {output_range!r}")
    if layout not in ("NCHW", "NHWC"):
        raise ValueError(f"layout must be NCHW or NHWC, got {layout!r}")
    make = allocate if allocate is not None else (lambda shape: np.empty(shape, np.uint8))
    if is_tensor(images) and not _viewable(images):
        return _quantise_tensor(images, output_range, layout, tolerance, make)
    array = as_numpy(images)
    out = make(_hwc_shape(array.shape, layout))
    hwc = array.transpose(0, 2, 3, 1) if layout == "NCHW" else array
    if hwc.dtype == np.uint8:
        out[...] = hwc
        return out
    if not np.issubdtype(hwc.dtype, np.floating):
        raise ScorerRequestError(
            f"images must be float or uint8, got {hwc.dtype}", kind="bad_input"
        )
    low, high = RANGES[output_range]
    values = hwc.astype(np.float32, copy=False)
    for index in range(values.shape[0]):
        image = values[index]
        _check_values(
            index,
            bool(np.isfinite(image).all()),
            float(image.min()),
            float(image.max()),
            output_range,
            tolerance,
        )
        scaled = (np.clip(image, np.float32(low), np.float32(high)) - np.float32(low)) * np.float32(
            255.0 / (high - low)
        )
        out[index] = np.floor(scaled + np.float32(0.5)).astype(np.uint8)
    return out


def _quantise_tensor(
    tensor: Any, output_range: str, layout: Layout, tolerance: float, make: Allocate
) -> np.ndarray:
    """The same checks and fp32 transform as the numpy path, run on the tensor's own device."""
    import torch  # present: `tensor` is one of its tensors

    out = make(_hwc_shape(tuple(tensor.shape), layout))
    hwc = tensor.detach()
    hwc = hwc.permute(0, 2, 3, 1) if layout == "NCHW" else hwc
    if hwc.dtype == torch.uint8:
        torch.from_numpy(out).copy_(hwc)
        return out
    if not hwc.is_floating_point():
        raise ScorerRequestError(
            f"images must be float or uint8, got {hwc.dtype}", kind="bad_input"
        )
    if hwc.shape[0] == 0:
        return out
    low, high = RANGES[output_range]
    values = hwc.float()
    flat = values.reshape(values.shape[0], -1)
    finite = torch.isfinite(flat).all(dim=1).tolist()
    lows, highs = flat.amin(dim=1).tolist(), flat.amax(dim=1).tolist()
    for index in range(len(finite)):
        _check_values(index, finite[index], lows[index], highs[index], output_range, tolerance)
    scaled = (values.clamp(low, high) - low) * (255.0 / (high - low))
    # device -> host, into `out`
    torch.from_numpy(out).copy_(torch.floor(scaled + 0.5).to(torch.uint8))
    return out
