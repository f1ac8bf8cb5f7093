"""Validation of score requests and responses as they cross the wire.

Both sides use it: the child decodes requests into `ScoreItem`s; the in-process
backend runs the very same conversion so local and managed scoring cannot drift.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from scorers import item_fields
from scorers.base import ScoreItem, ScoreResult, numpy_if_imported

if TYPE_CHECKING:
    import numpy as np

# The wire item, in the order the trainer writes it (supervisor.types.RewardItem.to_wire): read from
# the one declaration of an item's fields (scorers.item_fields). The trainer writes these, the child
# accepts only these.
WIRE_FIELDS = item_fields.NAMES
ITEM_FIELDS = frozenset(WIRE_FIELDS)
MEDIA_FIELDS = frozenset(item_fields.MEDIA)  # arrays: never JSON
OMITTED_WHEN_EMPTY = frozenset(item_fields.OMITTED_WHEN_EMPTY)  # {} or (): not sent
# pixels: uint8 arrays, checked by `check_media` (audio, float32, by `check_audio`)
MEDIA_LAYOUTS = {
    field.name: field.layout
    for field in item_fields.FIELDS
    if field.kind == item_fields.ARRAY and field.dtype == "uint8"
}
REQUEST_FIELDS = frozenset(["items", "group_size", "terms"])  # terms: the ones wanted (absent: all)
MAX_CONDITION_MEDIA = 16  # per item and kind
# More would be a (samples, channels) array handed over transposed: 22.2 surround has 24.
MAX_AUDIO_CHANNELS = 32


MAX_ID_CHARS = 1024


class RequestError(ValueError):
    """A request is well-framed but its content is invalid (answered 400/422)."""


@dataclass(frozen=True)
class Limits:
    """What one request may carry (the parent's LimitsConfig, shipped in the boot config)."""

    max_request_bytes: int = 1 << 30
    max_items: int = 4096
    max_text_chars: int = 1 << 20
    max_media_bytes: int = 512 << 20
    openrlhf_max_request_bytes: int = 16 << 20  # serve's OpenRLHF route (JSON): see LimitsConfig
    # /score's JSON form (UniRL's, base64 media): see LimitsConfig
    json_max_request_bytes: int = 128 << 20
    # connections that have not sent an authenticated request (see child_runtime.gate)
    max_pending_connections: int = 64
    pending_connection_timeout_s: float = 10.0


def _optional_str(item: dict, key: str, where: str, limit: int) -> str | None:
    value = item.get(key)
    if value is not None and not isinstance(value, str):
        raise RequestError(f"{where}.{key} must be a string or null, got {type(value).__name__}")
    if value is not None and len(value) > limit:
        raise RequestError(f"{where}.{key} has {len(value)} characters (limit {limit})")
    return value


def _check_strings(value: Any, where: str, limit: int) -> None:
    """Every string inside a JSON value (reference, metadata) obeys the text limit too."""
    stack = [value]
    while stack:
        current = stack.pop()
        if isinstance(current, str):
            if len(current) > limit:
                raise RequestError(
                    f"{where} holds a string of {len(current)} characters (limit {limit})"
                )
        elif isinstance(current, dict):
            stack.extend(current.keys())
            stack.extend(current.values())
        elif isinstance(current, list):
            stack.extend(current)


def check_media(value: Any, name: str, where: str) -> np.ndarray:
    """`image` is uint8 HWC, `video` uint8 THWC, with 1, 3 or 4 channels; anything else is
    refused."""
    layout = MEDIA_LAYOUTS[name]
    numpy = numpy_if_imported()  # an array exists only once numpy is imported
    if numpy is None or not isinstance(value, numpy.ndarray):
        raise RequestError(f"{where}.{name} must be an array, got {type(value).__name__}")
    if value.dtype != numpy.uint8 or value.ndim != len(layout) or value.shape[-1] not in (1, 3, 4):
        raise RequestError(
            f"{where}.{name} must be uint8 {layout} with 1, 3 or 4 channels, got "
            f"{value.dtype} {list(value.shape)}"
        )
    return value


def check_audio(audio: Any, sample_rate: Any, where: str) -> np.ndarray | None:
    """`audio` is float32 (channels, samples), 1..MAX_AUDIO_CHANNELS channels, at least one sample,
    every sample finite; `audio_sample_rate` a positive int exactly when audio is present. Both
    sides run this."""
    if audio is None:
        if sample_rate is not None:
            raise RequestError(
                f"{where}.audio_sample_rate is {sample_rate!r}, but the item has no audio"
            )
        return None
    numpy = numpy_if_imported()  # an array exists only once numpy is imported
    if (
        numpy is None
        or not isinstance(audio, numpy.ndarray)
        or audio.dtype != numpy.float32
        or audio.ndim != 2
    ):
        got = (
            f"{audio.dtype} {list(audio.shape)}"
            if hasattr(audio, "dtype")
            else type(audio).__name__
        )
        raise RequestError(f"{where}.audio must be float32 (channels, samples), got {got}")
    channels, samples = audio.shape
    if not 1 <= channels <= MAX_AUDIO_CHANNELS or samples < 1:
        raise RequestError(
            f"{where}.audio has shape {list(audio.shape)}: (channels, samples) with "
            f"1..{MAX_AUDIO_CHANNELS} "
            "channels and at least one sample (a (samples, channels) array must be transposed)"
        )
    if isinstance(sample_rate, bool) or not isinstance(sample_rate, int) or sample_rate < 1:
        raise RequestError(
            f"{where}.audio_sample_rate must be a positive int (Hz) with audio, got {sample_rate!r}"
        )
    finite = numpy.isfinite(audio)
    if not finite.all():
        channel, sample = (int(i) for i in numpy.argwhere(~finite)[0])
        raise RequestError(
            f"{where}.audio has a non-finite sample ({audio[channel, sample]} at channel "
            f"{channel}, sample {sample})"
        )
    return audio


def _limited(media: np.ndarray, name: str, where: str, limit: int, copy: bool) -> np.ndarray:
    """Read-only view (zero-copy from the wire or the shared segment) unless the scorer writes to
    its inputs."""
    if media.nbytes > limit:
        raise RequestError(f"{where}.{name} has {media.nbytes} bytes (limit {limit})")
    if copy:
        return media.copy()
    view = media.view()
    view.flags.writeable = False  # in-process, too: a scorer never writes into the trainer's arrays
    return view


def _media(item: dict, name: str, where: str, limit: int, copy: bool) -> np.ndarray | None:
    value = item.get(name)
    return (
        None
        if value is None
        else _limited(check_media(value, name, where), name, where, limit, copy)
    )


def _audio(item: dict, where: str, limit: int, copy: bool) -> tuple[np.ndarray | None, int | None]:
    """The waveform (checked, limited like any media) and its sample rate."""
    audio = check_audio(item.get("audio"), item.get("audio_sample_rate"), where)
    if audio is None:
        return None, None
    return _limited(audio, "audio", where, limit, copy), item["audio_sample_rate"]


def _condition_media(
    item: dict, name: str, kind: str, where: str, limit: int, copy: bool
) -> tuple[np.ndarray, ...]:
    """Nested per item: a list of arrays of `kind`, each checked like the item's own media."""
    values = item.get(name)
    if values is None:
        return ()
    if not isinstance(values, list) or len(values) > MAX_CONDITION_MEDIA:
        raise RequestError(f"{where}.{name} must be a list of at most {MAX_CONDITION_MEDIA} arrays")
    media = []
    for i, value in enumerate(values):
        checked = _media({kind: value}, kind, f"{where}.{name}[{i}]", limit, copy)
        if checked is None:
            raise RequestError(f"{where}.{name}[{i}] must be an array, got null")
        media.append(checked)
    return tuple(media)


def _token_count(item: dict, where: str) -> int | None:
    value = item.get("completion_tokens")
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
        raise RequestError(f"{where}.completion_tokens must be an int >= 0 or null, got {value!r}")
    return value


def item_from_wire(
    raw: Any, index: int, limits: Limits = Limits(), copy_media: bool = False
) -> ScoreItem:
    where = f"items[{index}]"
    if not isinstance(raw, dict):
        raise RequestError(f"{where} must be an object")
    unknown = set(raw) - ITEM_FIELDS
    if unknown:
        raise RequestError(f"{where} has unknown fields {sorted(unknown)}")
    item_id = raw.get("id")
    if not isinstance(item_id, str) or not item_id or len(item_id) > MAX_ID_CHARS:
        raise RequestError(
            f"{where}.id must be a non-empty string of at most {MAX_ID_CHARS} characters"
        )
    metadata = raw.get("metadata")
    if metadata is None:
        metadata = {}
    elif not isinstance(metadata, dict):
        raise RequestError(f"{where}.metadata must be an object")
    _check_strings(raw.get("reference"), f"{where}.reference", limits.max_text_chars)
    _check_strings(metadata, f"{where}.metadata", limits.max_text_chars)
    audio, sample_rate = _audio(
        raw, f"{where} (id={item_id!r})", limits.max_media_bytes, copy_media
    )
    return ScoreItem(
        id=item_id,
        group_id=_optional_str(raw, "group_id", where, MAX_ID_CHARS),
        prompt=_optional_str(raw, "prompt", where, limits.max_text_chars),
        text=_optional_str(raw, "text", where, limits.max_text_chars),
        image=_media(raw, "image", where, limits.max_media_bytes, copy_media),
        video=_media(raw, "video", where, limits.max_media_bytes, copy_media),
        reference=raw.get("reference"),
        metadata=metadata,
        finish_reason=_optional_str(raw, "finish_reason", where, MAX_ID_CHARS),
        completion_tokens=_token_count(raw, where),
        data_source=_optional_str(raw, "data_source", where, MAX_ID_CHARS),
        condition_images=_condition_media(
            raw, "condition_images", "image", where, limits.max_media_bytes, copy_media
        ),
        condition_videos=_condition_media(
            raw, "condition_videos", "video", where, limits.max_media_bytes, copy_media
        ),
        audio=audio,
        audio_sample_rate=sample_rate,
    )


def request_from_wire(
    meta: Any, limits: Limits = Limits(), copy_media: bool = False
) -> tuple[list[ScoreItem], int | None]:
    """The items and the declared group size (None: not declared)."""
    items = items_from_wire(meta, limits, copy_media)
    group_size = meta.get("group_size")
    if group_size is not None and (
        isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1
    ):
        raise RequestError(f"request.group_size must be a positive int or null, got {group_size!r}")
    return items, group_size


def request_terms(meta: Any) -> list[str] | None:
    """The terms a request wants (`"terms": [...]`, checked against the scorer by `score_checked`);
    None when it does not say: all of them."""
    terms = meta.get("terms") if isinstance(meta, dict) else None
    if terms is None:
        return None
    if not isinstance(terms, list) or not all(isinstance(term, str) and term for term in terms):
        raise RequestError(f"request.terms must be a list of term names, got {terms!r}"[:300])
    return terms


def items_from_wire(
    meta: Any, limits: Limits = Limits(), copy_media: bool = False
) -> list[ScoreItem]:
    """Validate a decoded request body and build the items, ids unique.

    Media arrive as read-only views; `copy_media` gives private writable copies instead.
    """
    if not isinstance(meta, dict) or "items" not in meta:
        raise RequestError("request must be an object with an 'items' list")
    unknown = set(meta) - REQUEST_FIELDS
    if unknown:
        raise RequestError(f"request has unknown fields {sorted(unknown)}")
    raw_items = meta["items"]
    if not isinstance(raw_items, list) or not raw_items:
        raise RequestError("request.items must be a non-empty list")
    if len(raw_items) > limits.max_items:
        raise RequestError(f"request.items has {len(raw_items)} items (limit {limits.max_items})")
    items = [item_from_wire(raw, i, limits, copy_media) for i, raw in enumerate(raw_items)]
    seen: dict[str, int] = {}
    for index, item in enumerate(items):
        if item.id in seen:
            raise RequestError(
                f"items[{index}].id {item.id!r} duplicates items[{seen[item.id]}].id"
            )
        seen[item.id] = index
    return items


def response_to_wire(items: Sequence[ScoreItem], result: ScoreResult) -> dict[str, Any]:
    """Echo ids in order; scores travel as float64 arrays (exact, never JSON floats: stdlib arrays,
    so that a text scorer's child never imports numpy); items the scorer could not score are named
    with why (their scores are NaN)."""
    answer = {
        "ids": [item.id for item in items],
        "terms": {name: array("d", values) for name, values in result.terms.items()},
        "diagnostics": result.diagnostics,
    }
    if result.failed:
        answer["failed"] = {
            items[position].id: why for position, why in sorted(result.failed.items())
        }
    if result.term_failed:  # one term's failures: the item's other terms stand
        answer["term_failed"] = {
            term: {items[position].id: why for position, why in sorted(whys.items())}
            for term, whys in result.term_failed.items()
        }
    if result.not_applicable:  # a term that does not apply to an item: no value, no failure
        answer["not_applicable"] = {
            term: [items[position].id for position in sorted(where)]
            for term, where in result.not_applicable.items()
        }
    if result.details:  # what the scorer says of an item, under its id (reporting only)
        answer["details"] = {
            items[position].id: said for position, said in sorted(result.details.items())
        }
    return answer
