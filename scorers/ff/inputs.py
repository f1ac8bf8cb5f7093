"""Items -> the keyword lists an FF-style reward model is called with: only its declared fields,
media as PIL (`use_tensor_inputs` False) or as float tensors in [0, 1] (True; torch imported only
then), audio as float32 (channels, samples) NumPy arrays or tensors (its rate, in Hz, is the field
`audio_sample_rate`, our addition: FF names none), condition media nested per sample, metadata as
one JSON string the model parses itself."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import numpy as np

from scorers import item_fields
from scorers.base import ScoreItem
from scorers.ff.models import RewardModelConfigError

TEXT_FIELDS = ("prompt", "text")
MEDIA_FIELDS = item_fields.MEDIA  # image, video, condition_images, condition_videos, audio
FIELDS = (*TEXT_FIELDS, *MEDIA_FIELDS, "audio_sample_rate", "metadata")


def check_fields(model: str, fields: Any) -> tuple[str, ...]:
    """The declared fields, or a refusal naming the model and what it may declare."""
    if isinstance(fields, str) or not isinstance(fields, (tuple, list)) or not fields:
        raise RewardModelConfigError(
            f"reward model {model}: required_fields must be a non-empty tuple of names"
        )
    for name in fields:
        if name not in FIELDS:
            raise RewardModelConfigError(
                f"reward model {model}: required_fields has {name!r}; the fields are "
                f"{', '.join(FIELDS)}"
            )
    return tuple(fields)


def model_inputs(
    items: Sequence[ScoreItem], fields: Sequence[str], tensors: bool
) -> dict[str, list[Any]]:
    """One list per declared field, one entry per item, in item order."""
    convert = _tensor if tensors else _pil
    inputs: dict[str, list[Any]] = {}
    for name in fields:
        if name in TEXT_FIELDS:
            inputs[name] = [getattr(item, name) for item in items]
        elif name == "metadata":
            inputs[name] = [json.dumps(item.metadata, sort_keys=True) for item in items]
        elif name in ("audio", "audio_sample_rate"):
            inputs[name] = [_audio(item, name, tensors) for item in items]
        elif name == "image":
            inputs[name] = [convert(item.required_image(), False) for item in items]
        elif name == "video":
            inputs[name] = [convert(item.required_video(), True) for item in items]
        elif name == "condition_images":
            inputs[name] = [
                _nested(item.condition_images, convert, False, tensors) for item in items
            ]
        else:
            inputs[name] = [
                _nested(item.condition_videos, convert, True, tensors) for item in items
            ]
    return inputs


def _audio(item: ScoreItem, name: str, tensors: bool) -> Any:
    """The waveform as a private float32 (channels, samples) copy, NumPy or a tensor; or its
    rate."""
    audio, rate = item.required_audio()
    if name == "audio_sample_rate":
        return rate
    if not tensors:
        return np.array(audio, dtype=np.float32)
    import torch

    return torch.from_numpy(np.array(audio, dtype=np.float32))


def _nested(media: Sequence[np.ndarray], convert: Any, video: bool, tensors: bool) -> Any:
    """One sample's condition media: a list (PIL); a stacked tensor when all share a shape, else a
    list."""
    converted = [convert(array, video) for array in media]
    if tensors and converted and len({tuple(t.shape) for t in converted}) == 1:
        import torch

        return torch.stack(converted)
    return converted


def _pil(array: np.ndarray, video: bool) -> Any:
    """An HWC uint8 image -> a PIL image (RGB, or L for one channel); a THWC clip -> a list of
    frames."""
    from PIL import Image

    if video:
        return [_pil(frame, False) for frame in array]
    return Image.fromarray(np.ascontiguousarray(array[:, :, 0] if array.shape[2] == 1 else array))


def _tensor(array: np.ndarray, video: bool) -> Any:
    """An HWC image -> a float32 CHW tensor in [0, 1]; a THWC clip -> TCHW (a private copy either
    way)."""
    import torch

    values = torch.from_numpy(array.astype(np.float32) / 255.0)
    return (
        values.permute(0, 3, 1, 2).contiguous() if video else values.permute(2, 0, 1).contiguous()
    )
