"""UniRL's columnar RewardRequest -> our RewardRequest, and our RewardResponse -> UniRL's.

UniRL hands one column per field: `generated` media by modality (float CHW images and TCHW videos
in [0, 1], as torch tensors; `Texts`), `conditioning` media (an edit's source image), the prompts
(`original_prompt` / `generation_prompt`, picked by the backend's `prompt_source`), `metadata`,
`sample_ids`, `group_ids`, and `audio_sample_rate` (one for the batch). Media are quantised once
(adapters/images: clamp, scale, round half up) straight into the backend's arena. Generated audio
(`[L]` or `[C, L]` waveforms) travels with any kind, as float32 (channels, samples) with the rate,
which it then requires. Read duck-typed: nothing of UniRL is imported here but its RewardResponse,
when one is built.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from supervisor.adapters import items as adapter_items
from supervisor.adapters.images import Allocate, to_uint8_hwc
from supervisor.errors import ConfigError, ScorerRequestError
from supervisor.tensors import is_tensor
from supervisor.types import RewardItem, RewardRequest, RewardResponse

_CALLS = itertools.count()
MEDIA_FIELD = {"image": "image", "video": "video", "text": "text", "audio": "audio"}


def _images(primitive: Any, allocate: Allocate) -> list[np.ndarray]:
    """UniRL `Images` (CHW in [0, 1] each, any sizes) -> uint8 HWC arrays."""
    return [
        to_uint8_hwc(image.pixels[None], "zero_one", "NCHW", allocate=allocate)[0]
        for image in primitive.to_list()
    ]


def _videos(primitive: Any, allocate: Allocate) -> list[np.ndarray]:
    """UniRL `Videos` (TCHW in [0, 1] each) -> uint8 THWC arrays."""
    return [
        to_uint8_hwc(video.frames, "zero_one", "NCHW", allocate=allocate)
        for video in primitive.to_list()
    ]


def _waveform(value: Any) -> Any:
    """A UniRL waveform as float32 on the host: a view when it is a CPU float32 tensor already (its
    shape and values are RewardItem's to check: 1-D is mono)."""
    if is_tensor(value):
        return value.detach().float().cpu().numpy()
    return value


def _column(primitive: Any, kind: str, allocate: Allocate) -> list[Any]:
    if kind == "text":
        return list(primitive.texts)
    if kind == "audio":
        return [_waveform(audio.waveform) for audio in primitive.to_list()]
    return _images(primitive, allocate) if kind == "image" else _videos(primitive, allocate)


def _audio(request: Any, kind: str, media: list[Any], allocate: Allocate) -> list[dict[str, Any]]:
    """Per item, `audio` and `audio_sample_rate` when UniRL generated audio (the primary column when
    the backend scores audio); nothing otherwise."""
    primitive = (getattr(request, "generated", None) or {}).get("audio")
    if primitive is None:
        return [{} for _ in media]
    waveforms = media if kind == "audio" else _column(primitive, "audio", allocate)
    if len(waveforms) != len(media):
        raise ScorerRequestError(
            f"UniRL generated {len(waveforms)} audio for {len(media)} items", kind="bad_input"
        )
    rate = getattr(request, "audio_sample_rate", None)
    if rate is None:
        raise ScorerRequestError(
            "UniRL generated audio without a sample rate (request.audio_sample_rate is None: "
            "the frontier's primitive_metadata['audio'] has no 'sample_rate')",
            kind="bad_input",
        )
    return [{"audio": waveform, "audio_sample_rate": rate} for waveform in waveforms]


def _generated(request: Any, kind: str, allocate: Allocate) -> list[Any]:
    primitive = (getattr(request, "generated", None) or {}).get(kind)
    if primitive is None:
        raise ScorerRequestError(
            f"the UniRL request generated "
            f"{sorted(getattr(request, 'generated', None) or {})}, but this backend scores "
            f"{kind!r}: check the recipe's reward / model pairing",
            kind="bad_input",
        )
    return _column(primitive, kind, allocate)


def _conditions(
    request: Any, count: int, allocate: Allocate
) -> dict[str, list[tuple[np.ndarray, ...]]]:
    """Conditioning media per item: `condition_images` (an edit's source), `condition_videos`."""
    out: dict[str, list[tuple[np.ndarray, ...]]] = {}
    conditioning = getattr(request, "conditioning", None) or {}
    for kind, field in (("image", "condition_images"), ("video", "condition_videos")):
        if conditioning.get(kind) is not None:
            out[field] = [(media,) for media in _column(conditioning[kind], kind, allocate)]
    unknown = sorted(set(conditioning) - {"image", "video"})
    if unknown:
        raise ScorerRequestError(
            f"UniRL conditioning {unknown} has no field here (image, video)", kind="bad_input"
        )
    for field, column in out.items():
        if len(column) != count:
            raise ScorerRequestError(f"{len(column)} {field} for {count} items", kind="bad_input")
    return out


def _column_or_none(values: Sequence[Any] | None, count: int, what: str) -> list[Any]:
    if values is None or len(values) == 0:
        return [None] * count
    if len(values) != count:
        raise ScorerRequestError(
            f"UniRL request has {len(values)} {what} for {count} items", kind="bad_input"
        )
    return list(values)


def reward_request(
    request: Any, kind: str, prompts: Sequence[str], reference_key: str, allocate: Allocate
) -> RewardRequest:
    """Our request for UniRL's: one item per row, ids from `sample_ids` (made when absent), the gold
    from `metadata[i][reference_key]` (None when absent: the scorer decides whether it needs
    one)."""
    call = next(_CALLS)
    media = _generated(request, kind, allocate)
    count = len(media)
    conditions = _conditions(request, count, allocate)
    sounds = _audio(request, kind, media, allocate)
    ids = _column_or_none(getattr(request, "sample_ids", None), count, "sample_ids")
    groups = _column_or_none(getattr(request, "group_ids", None), count, "group_ids")
    metadata = _column_or_none(getattr(request, "metadata", None), count, "metadata")
    texts = _column_or_none(prompts, count, "prompts")
    items = [
        _item(
            i,
            ids[i] if ids[i] is not None else f"unirl{call}-{i}",
            groups[i],
            texts[i],
            {
                MEDIA_FIELD[kind]: media[i],
                **sounds[i],
                **{field: column[i] for field, column in conditions.items()},
            },
            metadata[i],
            reference_key,
        )
        for i in range(count)
    ]
    return adapter_items.request("UniRL's compute_rewards", items)


def _item(
    index: int,
    item_id: Any,
    group_id: Any,
    prompt: Any,
    media: dict[str, Any],
    metadata: Any,
    reference_key: str,
) -> RewardItem:
    if metadata is not None and not isinstance(metadata, Mapping):
        raise ScorerRequestError(
            f"UniRL item {index}: metadata must be a mapping or None, got "
            f"{type(metadata).__name__}",
            kind="bad_input",
        )
    meta = adapter_items.plain(dict(metadata or {}))
    source = meta.get("data_source")
    return adapter_items.item(
        f"UniRL item {index} (sample_id {item_id!r})",
        id=str(item_id),
        group_id=None if group_id is None else str(group_id),
        prompt=prompt,
        reference=meta.get(reference_key),
        metadata=meta,
        data_source=source if isinstance(source, str) else None,
        **media,
    )


def unirl_response(
    rewards: Sequence[float],
    components: Mapping[str, list[float]],
    successes: Sequence[bool],
    errors: Sequence[str | None],
    started: float,
) -> Any:
    """UniRL's RewardResponse: an item is a success when its reward may be used (a panel item short
    of an optional term only is one: its `errors` entry still names the term)."""
    try:
        from unirl.types.reward import RewardResponse as UniRLResponse
    except ImportError as exc:
        raise ConfigError(
            f"UniRL is not importable here ({exc}): its RewardResponse cannot be built"
        ) from exc
    return UniRLResponse(
        rewards=[float(reward) for reward in rewards],
        component_rewards={name: list(values) for name, values in components.items()},
        successes=list(successes),
        errors=list(errors),
        compute_time=time.perf_counter() - started,
    )


def contributions(
    terms: Sequence[Any], request: RewardRequest, response: RewardResponse
) -> dict[str, list[float]]:
    """Per term, what it added to each item's reward: weight x value, 0.0 where it does not apply or
    an optional term failed (it added nothing). An item's contributions sum (in term order) to its
    reward. UniRL turns every component into a float tensor: a None there is a TypeError, a NaN is
    never sent."""
    out: dict[str, list[float]] = {}
    for term in terms:
        values = response.component_rewards[term.name]
        out[term.name] = [
            0.0 if value is None else term.weight_for(item) * value
            for item, value in zip(request.items, values, strict=True)
        ]
    return out
