"""UniRL's reward-service protocol (`protocol_version` "1"): the JSON form of `/score`.

UniRL 0.2.0's `RemoteRewardBackend` (unirl/reward/remote.py) posts

    {"protocol_version": "1", "requests": [{"history": [{"text": ..., "image_b64": ...}, ...],
      "required_rewards": [...], "metadata": {...} or null, "request_id": ..., "sample_id": ...,
      "group_id": ..., "source_rank": ..., "policy_version": ..., "scorer_version": ...,
      "idempotency_key": ...}, ...]}

and reads `{"protocol_version": "1", "results": [{reward: {sub_metric: value}}], "errors": [{reward:
why}], "identities": [...]}`, one entry of each per request, in order. Read here as one item each:

- `request_id` is the item's id; `group_id` its group (a number becomes its text); the other
  identity fields are echoed as given, with `scorer_version` the server's identity hash (a request
  that pins another is refused). `metadata` is the item's metadata; its `reference` and
  `data_source` keys are the item's gold and dataset tag (as for UniRL's in-process adapter).
- `history` is the conversation, in order; its last turn is the one scored. A turn with `image_b64`
  (PNG, JPEG, ... decoded to RGB) is an image item: that turn's `text` is the prompt (UniRL sends it
  there), and each earlier turn's image is a condition image (UniRL's image-edit history). A last
  turn without media is a text item: its `text` is the text scored, and the turn before it (if any)
  holds the prompt. A turn with `video_b64` (an mp4, as UniRL's `export_to_video` writes it at
  its `video_fps`) is a video item of that one turn: its frames are decoded with PyAV to RGB, THWC
  uint8 (the binary frame's video), and its `text` is the prompt.
- `required_rewards` names the scorer (its reward: a served panel's weighted reward, else its terms'
  sum, first, then each term as a sub-metric) or some of its terms (`{term: {term: value}}` each);
  left out or empty, the scorer. Every request of one call names the same ones.
- An item the scorer could not score, or a term that failed for it, is an `errors` entry for each
  reward left without a value (the answer is still 200, as UniRL's server answers); a term that does
  not apply to an item is 0.0 there (as this project's UniRL adapters give it).

Everything the binary frame checks applies (`items.request_from_wire`); decoded pixels count against
`max_media_bytes` each and `max_request_bytes` together, before they are decoded (a video's frame by
frame, its size read from the stream's header first).

`serve --unirl-secret-file` serves this same handler at `ROUTE/<secret>/score` for UniRL's own
client, which sends no header, with its `/health` at `ROUTE/<secret>/health` (`served_rewards`).
"""

from __future__ import annotations

import base64
import binascii
import io
import math
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from child_runtime.protocol.items import MAX_ID_CHARS, Limits, RequestError
from child_runtime.protocol.unirl_video import decode_video
from scorers.base import ScoreResult, ScorerSpec

if TYPE_CHECKING:
    import numpy as np

PROTOCOL_VERSION = "1"
ROUTE = "/unirl"  # served at ROUTE/<secret>/health and /score: the secret is checked, then cut off
TOP_FIELDS = frozenset(["protocol_version", "requests"])
REQUEST_FIELDS = frozenset(
    [
        "history",
        "required_rewards",
        "metadata",
        "request_id",
        "sample_id",
        "group_id",
        "source_rank",
        "policy_version",
        "scorer_version",
        "idempotency_key",
    ]
)
ECHOED = ("request_id", "sample_id", "group_id", "source_rank", "policy_version", "idempotency_key")
TURN_FIELDS = frozenset(["text", "image_b64", "video_b64"])
MAX_TURNS = 17  # the scored turn and up to MAX_CONDITION_MEDIA condition images before it


class IdentityMismatch(RequestError):
    """A request pins a `scorer_version` other than this server's identity (answered 409)."""


@dataclass(frozen=True)
class Parsed:
    """One JSON call: the items as a binary-frame request, what to echo per item, the rewards
    asked."""

    wire: dict[str, Any]
    identities: list[dict[str, Any]]
    rewards: tuple[str, ...]
    terms: list[str] | None  # the scorer's terms to score (None: all)


def parse(payload: Any, spec: ScorerSpec, identity: str, limits: Limits) -> Parsed:
    """UniRL's request body (parsed JSON) -> the items' wire request; RequestError names what is
    wrong."""
    if not isinstance(payload, dict):
        raise RequestError(
            'the body must be a JSON object {"protocol_version": "1", "requests": [...]}'
        )
    unknown = sorted(set(payload) - TOP_FIELDS)
    if unknown:
        raise RequestError(f"unknown fields {unknown}: UniRL's protocol has {sorted(TOP_FIELDS)}")
    version = payload.get("protocol_version")
    if version != PROTOCOL_VERSION and not (type(version) is int and version == 1):
        raise RequestError(
            f'protocol_version must be "1" (UniRL\'s reward-service protocol), got {version!r}'
        )
    requests = payload.get("requests")
    if not isinstance(requests, list) or not requests:
        raise RequestError("requests must be a non-empty list")
    if len(requests) > limits.max_items:
        raise RequestError(f"requests has {len(requests)} entries (limit {limits.max_items})")
    rewards = _rewards(requests, spec)
    budget = _Pixels(limits)
    items, identities = [], []
    for index, raw in enumerate(requests):
        item, echoed = _item(raw, index, identity, budget)
        items.append(item)
        identities.append({**echoed, "scorer_version": identity or None})
    wanted = None if spec.name in rewards and spec.name not in spec.term_names() else list(rewards)
    return Parsed({"items": items}, identities, rewards, wanted)


def _rewards(requests: list[Any], spec: ScorerSpec) -> tuple[str, ...]:
    """The rewards every request asks for (one list for the call), each served here."""
    served = {spec.name, *spec.term_names()}
    first = requests[0].get("required_rewards") if isinstance(requests[0], dict) else None
    for index, raw in enumerate(requests):
        given = raw.get("required_rewards") if isinstance(raw, dict) else None
        if given != first:
            raise RequestError(
                f"requests[{index}].required_rewards differs from requests[0]'s: one list per call"
            )
    if first is None or first == []:
        return (spec.name,)
    if (
        not isinstance(first, list)
        or not all(isinstance(name, str) for name in first)
        or len(set(first)) != len(first)
    ):
        raise RequestError(
            f"required_rewards must be a list of distinct names, got {first!r}"[:300]
        )
    missing = [name for name in first if name not in served]
    if missing:
        raise RequestError(
            f"required_rewards {missing} are not served here (served: {sorted(served)})"
        )
    return tuple(first)


def _item(
    raw: Any, index: int, identity: str, budget: _Pixels
) -> tuple[dict[str, Any], dict[str, Any]]:
    """One request as a wire item, and the identity fields it echoes."""
    where = f"requests[{index}]"
    if not isinstance(raw, dict):
        raise RequestError(f"{where} must be an object")
    unknown = sorted(set(raw) - REQUEST_FIELDS)
    if unknown:
        raise RequestError(f"{where} has unknown fields {unknown}")
    request_id = raw.get("request_id")
    if not isinstance(request_id, str) or not request_id or len(request_id) > MAX_ID_CHARS:
        raise RequestError(
            f"{where}.request_id must be a non-empty string of at most {MAX_ID_CHARS} characters"
        )
    pinned = raw.get("scorer_version")
    if pinned is not None and pinned != identity:
        raise IdentityMismatch(
            f"{where}.scorer_version {str(pinned)[:80]!r} is not this server's ({identity})"
        )
    metadata = raw.get("metadata")
    if metadata is not None and not isinstance(metadata, dict):
        raise RequestError(f"{where}.metadata must be an object or null")
    meta = metadata or {}
    item = {
        "id": request_id,
        "group_id": _group(raw.get("group_id"), where),
        "metadata": meta,
        "reference": meta.get("reference"),
        "data_source": meta.get("data_source")
        if isinstance(meta.get("data_source"), str)
        else None,
        **_history(raw.get("history"), where, budget),
    }
    return item, {key: raw.get(key) for key in ECHOED}


def _group(value: Any, where: str) -> str | None:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    raise RequestError(
        f"{where}.group_id must be a string, an integer or null, got {type(value).__name__}"
    )


def _history(history: Any, where: str, budget: _Pixels) -> dict[str, Any]:
    """The item's prompt, text, image and condition images, from its turns (see the module
    docstring)."""
    if not isinstance(history, list) or not 1 <= len(history) <= MAX_TURNS:
        raise RequestError(f"{where}.history must be a list of 1 to {MAX_TURNS} turns")
    turns = [_turn(turn, f"{where}.history[{i}]") for i, turn in enumerate(history)]
    last, before = turns[-1], turns[:-1]
    if any(turn.get("video_b64") is not None for turn in turns):  # a video item: one turn
        if before:
            raise RequestError(f"{where}.history of a video item is one turn (UniRL sends one)")
        return {
            "prompt": last.get("text"),
            "video": budget.video(last["video_b64"], f"{where}.history[0].video_b64"),
        }
    if last.get("image_b64") is None:  # a text item: [prompt turn,] scored turn
        if len(turns) > 2 or any(turn.get("image_b64") is not None for turn in turns):
            raise RequestError(
                f"{where}.history of a text item is [the prompt's turn, the scored turn] or "
                f"one turn"
            )
        return {"prompt": before[0].get("text") if before else None, "text": last.get("text")}
    conditions = []
    for i, turn in enumerate(before):
        if turn.get("image_b64") is None:
            raise RequestError(
                f"{where}.history[{i}] has no image: before the scored turn come condition images"
            )
        conditions.append(budget.decode(turn["image_b64"], f"{where}.history[{i}].image_b64"))
    image = budget.decode(last["image_b64"], f"{where}.history[{len(turns) - 1}].image_b64")
    return {"prompt": last.get("text"), "image": image, "condition_images": conditions or None}


def _turn(turn: Any, where: str) -> dict[str, Any]:
    if not isinstance(turn, dict):
        raise RequestError(f"{where} must be an object with text and image_b64")
    unknown = sorted(set(turn) - TURN_FIELDS)
    if unknown:
        raise RequestError(f"{where} has unknown fields {unknown}")
    if turn.get("video_b64") is not None and turn.get("image_b64") is not None:
        raise RequestError(f"{where} has image_b64 and video_b64: a turn holds one medium")
    for key in ("text", "image_b64", "video_b64"):
        if turn.get(key) is not None and not isinstance(turn[key], str):
            raise RequestError(f"{where}.{key} must be a string or null")
    return turn


class _Pixels:
    """Decodes base64 images, each within max_media_bytes and all within max_request_bytes, counted
    from the image's header before its pixels are decoded."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.left = limits.max_request_bytes

    def decode(self, text: str, where: str) -> np.ndarray:
        data = _unbase64(text, where)
        try:
            import numpy
            from PIL import Image
        except ImportError as exc:
            raise RequestError(
                f"{where}: this scorer's env cannot decode images (it lacks {exc.name})"
            ) from exc
        try:
            with Image.open(io.BytesIO(data)) as image:
                width, height = image.size
                self._charge(3 * width * height, where)
                return numpy.asarray(image.convert("RGB"))
        except (OSError, ValueError, SyntaxError, zlib.error, Image.DecompressionBombError) as exc:
            # PIL raises SyntaxError for a broken PNG chunk and lets zlib's errors through: the
            # client's bytes
            raise RequestError(f"{where} is not a readable image: {exc}"[:300]) from exc

    def video(self, text: str, where: str) -> np.ndarray:
        """An mp4 (base64) as THWC uint8 RGB frames, each charged as it is decoded
        (`unirl_video`)."""
        clip = [0]

        def charge(size: int, where: str) -> None:  # the clip's frames together, then the call's
            clip[0] += size
            if clip[0] > self.limits.max_media_bytes:
                raise RequestError(
                    f"{where} decodes to more than max_media_bytes={self.limits.max_media_bytes}"
                )
            self._charge(size, where)

        return decode_video(_unbase64(text, where), where, charge)

    def _charge(self, size: int, where: str) -> None:
        if size > self.limits.max_media_bytes:
            raise RequestError(
                f"{where} decodes to {size} bytes (limit "
                f"max_media_bytes={self.limits.max_media_bytes})"
            )
        if size > self.left:
            raise RequestError(f"{where}: the call's images decode to more than max_request_bytes")
        self.left -= size


def _unbase64(text: str, where: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise RequestError(f"{where} is not base64: {exc}") from exc


def served_rewards(spec: ScorerSpec) -> dict[str, list[str]]:
    """UniRL's `/health` `rewards`: each reward `required_rewards` may name here, with the
    sub-metrics `answer` gives it (the scorer's reward first, then its terms; a term, itself)."""
    terms = list(spec.term_names())
    whole = [spec.name]
    if spec.name not in terms:
        whole += [term for term in terms if term != spec.reward_term]
    return {spec.name: whole, **{term: [term] for term in terms}}


def answer(result: ScoreResult, parsed: Parsed, spec: ScorerSpec) -> dict[str, Any]:
    """UniRL's ScoreResponse for a scored call: results, errors and identities, one each per
    request."""
    results, errors = [], []
    for position in range(len(parsed.identities)):
        values: dict[str, dict[str, float]] = {}
        whys: dict[str, str] = {}
        for reward in parsed.rewards:
            why = _failure(result, position, _terms_of(reward, spec)) or _inapplicable(
                result, position, _terms_of(reward, spec)
            )
            if why is not None:
                whys[reward] = why
            else:
                values[reward] = _sub_metrics(result, position, reward, spec)
        results.append(values)
        errors.append(whys)
    return {
        "protocol_version": PROTOCOL_VERSION,
        "results": results,
        "errors": errors,
        "identities": parsed.identities,
    }


def _terms_of(reward: str, spec: ScorerSpec) -> Sequence[str]:
    """The terms whose failure leaves no value for `reward`."""
    if reward in spec.term_names():
        return [reward]
    return [spec.reward_term] if spec.reward_term else spec.term_names()


def _failure(result: ScoreResult, position: int, terms: Sequence[str]) -> str | None:
    if position in result.failed:
        return result.failed[position]
    failed = [
        (term, result.term_failed[term][position])
        for term in terms
        if position in result.term_failed.get(term, {})
    ]
    return "; ".join(f"term {term!r}: {why}" for term, why in failed) or None


def _inapplicable(result: ScoreResult, position: int, terms: Sequence[str]) -> str | None:
    """A reward none of whose terms applies to the item (its data source) has no value: said, never
    0.0."""
    if terms and all(position in result.not_applicable.get(term, ()) for term in terms):
        return f"no term of {list(terms)} applies to this item's data source"
    return None


def _value(result: ScoreResult, term: str, position: int) -> float:
    return float(result.terms[term][position])


def _sub_metrics(
    result: ScoreResult, position: int, reward: str, spec: ScorerSpec
) -> dict[str, float]:
    """A term: `{term: value}`; the scorer: its reward first, then each of its terms (but one that
    failed for the item: a served panel's optional term)."""
    if reward in spec.term_names():
        return {reward: _value(result, reward, position)}
    terms: Mapping[str, float] = {
        term: _value(result, term, position)
        for term in spec.term_names()
        if term != spec.reward_term
        and position not in result.term_failed.get(term, {})
        and position not in result.not_applicable.get(term, ())
    }
    total = (
        _value(result, spec.reward_term, position)
        if spec.reward_term
        else math.fsum(terms.values())
    )
    return {reward: total, **terms}
