"""Trainer-facing request and response types."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Annotated, Any

import numpy as np
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    JsonValue,
    StrictInt,
    model_validator,
)

from child_runtime.protocol.items import (
    MEDIA_FIELDS,
    OMITTED_WHEN_EMPTY,
    WIRE_FIELDS,
    check_audio,
    check_media,
)
from scorers.base import is_length_verdict
from scorers.diagnostics import to_metrics
from supervisor.errors import RewardContractError, validation_message
from supervisor.tensors import numpy_view


def _as_image(value: Any) -> np.ndarray | None:
    """Accept a uint8 HWC ndarray, a torch CPU tensor (viewed, not copied) or anything with
    `__array_interface__` (a PIL image)."""
    if value is None:
        return None
    value = numpy_view(value)
    if not isinstance(value, np.ndarray):
        if not hasattr(value, "__array_interface__"):
            raise ValueError(
                f"image must be a uint8 ndarray or a PIL image, got {type(value).__name__}"
            )
        value = np.asarray(value)
        if value.ndim == 2:
            value = value[:, :, None]
    return check_media(value, "image", "item")


def _as_video(value: Any) -> np.ndarray | None:
    return None if value is None else check_media(numpy_view(value), "video", "item")


def _as_audio(value: Any) -> np.ndarray | None:
    """A float32 ndarray or torch CPU tensor (viewed, not copied), (channels, samples); a 1-D one is
    mono, viewed as (1, samples). Checked with its sample rate and named by id in `_audio`."""
    value = numpy_view(value)
    if value is None or not isinstance(value, np.ndarray):
        return value
    return value.reshape(1, -1) if value.ndim == 1 else value


Image = Annotated[Any, BeforeValidator(_as_image)]
Video = Annotated[Any, BeforeValidator(_as_video)]
Audio = Annotated[Any, BeforeValidator(_as_audio)]


def _as_images(value: Any) -> tuple[np.ndarray, ...]:
    if value is None:
        return ()
    if not isinstance(value, (list, tuple)):
        raise ValueError("condition_images must be a list of images (nested per item)")
    return tuple(check_media(_as_image(image), "image", "condition_images") for image in value)


def _as_videos(value: Any) -> tuple[np.ndarray, ...]:
    if value is None:
        return ()
    if not isinstance(value, (list, tuple)):
        raise ValueError("condition_videos must be a list of videos (nested per item)")
    return tuple(check_media(numpy_view(video), "video", "condition_videos") for video in value)


Images = Annotated[Any, BeforeValidator(_as_images)]
Videos = Annotated[Any, BeforeValidator(_as_videos)]


def _is_empty(value: Any) -> bool:
    """An empty dict or tuple (never an array: its truth value is not defined)."""
    return isinstance(value, (dict, tuple, list)) and not value


# a RewardItem's fields beyond the item's: never sent
TRAINER_FIELDS = ("reward", "component_rewards")


class RewardItem(BaseModel):
    """One rollout to score. `reward` stays None until RewardService attaches one.

    `finish_reason` is the generation engine's verbatim verdict; `completion_tokens` the
    completion's length in tokens (the soft overlong penalty needs it); `data_source` the
    dataset tag that per-dataset weights and applicability match on; `condition_images`
    and `condition_videos` the conditioning media (an edit reward's source image); `audio` a
    float32 waveform (channels, samples; a 1-D one is mono) with its `audio_sample_rate` in Hz,
    which it requires.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)

    # The item's fields as scorers.item_fields declares them (names, order, defaults: held to it by
    # tests/contract/test_item_fields.py), then TRAINER_FIELDS, the trainer's own (never sent).
    id: str = Field(min_length=1)
    group_id: str | None = None
    prompt: str | None = None
    text: str | None = None
    image: Image = None
    video: Video = None
    reference: JsonValue = None
    metadata: dict[str, JsonValue] = Field(default_factory=dict)
    finish_reason: str | None = None
    completion_tokens: int | None = Field(default=None, ge=0)
    data_source: str | None = None
    condition_images: Images = ()
    condition_videos: Videos = ()
    audio: Audio = None
    audio_sample_rate: StrictInt | None = None
    reward: float | None = None
    component_rewards: dict[str, float | None] | None = None

    @property
    def is_length_truncated(self) -> bool:
        """True only for the exact verdict "length"; None reads as "not known to be truncated"."""
        return is_length_verdict(self.finish_reason)

    @model_validator(mode="after")
    def _json_safe(self) -> RewardItem:
        for name in ("reference", "metadata"):
            try:
                json.dumps(getattr(self, name), allow_nan=False)
            except ValueError as exc:
                raise ValueError(f"{name} must be finite JSON: {exc}") from exc
        return self

    @model_validator(mode="after")
    def _audio(self) -> RewardItem:
        """The wire's own audio check (dtype, shape, finite, the rate with it), naming the item."""
        check_audio(self.audio, self.audio_sample_rate, f"item {self.id!r}")
        return self

    def to_wire(self) -> dict[str, Any]:
        """The child's item schema: only what a scorer reads."""
        wire: dict[str, Any] = {}
        for key in WIRE_FIELDS:
            value = getattr(self, key)
            if value is None or (key in OMITTED_WHEN_EMPTY and _is_empty(value)):
                continue
            wire[key] = list(value) if isinstance(value, tuple) else value
        return wire

    @property
    def has_media(self) -> bool:
        """Arrays, which travel only through the wire's array frames (never as JSON)."""
        return any(
            getattr(self, key) is not None and not _is_empty(getattr(self, key))
            for key in MEDIA_FIELDS
        )


class RewardRequest(BaseModel):
    """An ordered batch; ids must be unique so every reward has exactly one owner.

    `group_size`: how many candidates each group (items sharing a `group_id`) has; when
    set here or in the backend's config, a group of another size is refused.
    `step`: the trainer's step this batch belongs to, when the trainer says. It never reaches a
    scorer; DistributedRewards checks it against the other ranks' (a rank out of step is caught).
    `groups_elsewhere`: group id -> how many of its candidates other ranks score in this step,
    counted toward its size. DistributedRewards sets it for a group that spans ranks and is
    scored where each candidate is (pointwise scoring); a trainer leaves it empty.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    items: list[RewardItem] = Field(min_length=1)
    group_size: int | None = Field(default=None, gt=0)
    step: int | None = Field(default=None, ge=0)
    groups_elsewhere: dict[str, Annotated[int, Field(gt=0)]] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _unique_ids(self) -> RewardRequest:
        seen: set[str] = set()
        for index, item in enumerate(self.items):
            if item.id in seen:
                raise ValueError(f"items[{index}].id {item.id!r} is not unique in the request")
            seen.add(item.id)
        return self

    @property
    def ids(self) -> list[str]:
        return [item.id for item in self.items]


# a scorer's own term failure: whether the term was optional is unknown
SCORER_TERM_FAILED = "scorer_term_failed"


class TermFailure(BaseModel):
    """A term that failed for these ids: they got no value from it (it added zero). An optional
    panel term's (any kind), or, with kind SCORER_TERM_FAILED, a scorer's own term in a backend's
    response, which only a panel may turn into an optional term's failure: it leaves the reward
    unusable."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    term: str
    ids: list[str]
    error: str
    kind: str


def per_item(
    ids: list[str], failures: Sequence[TermFailure]
) -> tuple[list[bool], list[str | None]]:
    """`successes` and `errors` of a response: an item whose reward lacks an optional term that
    failed for it is not a success, and its error names each such term and why."""
    why: dict[str, list[str]] = {}
    for failure in failures:
        for item_id in failure.ids:
            why.setdefault(item_id, []).append(
                f"term {failure.term!r} failed ({failure.kind}: {failure.error})"
            )
    return [item_id not in why for item_id in ids], [
        "; ".join(why[i]) if i in why else None for i in ids
    ]


def first_non_finite(response: RewardResponse) -> str | None:
    """The one finiteness rule of a response: a reward a trainer may use is finite, and so are its
    components (a success's, and an item's that is short of an optional term only). The model
    checks it when built, RewardService again at the end (a response built without validation);
    what is wrong, or None."""
    for index, (ok, usable, reward) in enumerate(
        zip(response.successes, response.usable(), response.rewards, strict=True)
    ):
        if not usable:
            continue
        if not math.isfinite(reward):
            state = "marked a success" if ok else "short of an optional term only"
            return f"rewards[{index}] (id={response.ids[index]!r}) is {reward} but {state}"
        for term, values in response.component_rewards.items():
            value = values[index]
            if value is not None and not math.isfinite(value):
                return (
                    f"component_rewards[{term!r}][{index}] (id={response.ids[index]!r}) is {value}"
                )
    return None


class RewardResponse(BaseModel):
    """Rewards in request order, with per-term components and per-item success.

    A component is None exactly where its term does not apply to the item (`applicable`
    says so; a term missing there applies to every item) or where an optional term failed
    (`term_failures` names the term, the ids and the error): never a fake 0 or NaN.
    `successes[i]` False says item i's reward is not whole, and `errors[i]` says why (None
    exactly for a success). Left out, both follow from `term_failures` (`per_item`, their one
    writer): an item an optional term failed for is not a success (its reward is the other
    terms' finite sum, as configured). A backend that states them otherwise (a server's answer)
    marks failed items, which a trainer must never use.
    `diagnostics` maps a term to its report (`scorers.diagnostics`); `metrics()` flattens them.
    `details` maps it (keyed as diagnostics) to what it said of single items, by id (a code
    reward's verdict per test, `scorers.details`): reporting only, never in a reward.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    ids: list[str]
    rewards: list[float]
    component_rewards: dict[str, list[float | None]]
    # left out: derived from term_failures (per_item)
    successes: list[bool] = Field(default_factory=list)
    errors: list[str | None] = Field(default_factory=list)
    applicable: dict[str, list[bool]] = Field(default_factory=dict)
    term_failures: list[TermFailure] = Field(default_factory=list)
    diagnostics: dict[str, Any] = Field(default_factory=dict)
    details: dict[str, dict[str, dict[str, Any]]] = Field(default_factory=dict)
    identity_hash: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _per_item(cls, data: Any) -> Any:
        """`successes` and `errors` have one writer: when left out, they follow from
        term_failures."""
        if (
            isinstance(data, dict)
            and "successes" not in data
            and "errors" not in data
            and "ids" in data
        ):
            failures = [TermFailure.model_validate(f) for f in data.get("term_failures", ())]
            successes, errors = per_item(list(data["ids"]), failures)
            data = {**data, "successes": successes, "errors": errors}
        return data

    @model_validator(mode="after")
    def _aligned(self) -> RewardResponse:
        n = len(self.ids)
        lengths = {
            "rewards": len(self.rewards),
            "successes": len(self.successes),
            "errors": len(self.errors),
        }
        lengths.update(
            {f"component_rewards[{k!r}]": len(v) for k, v in self.component_rewards.items()}
        )
        lengths.update({f"applicable[{k!r}]": len(v) for k, v in self.applicable.items()})
        for name, length in lengths.items():
            if length != n:
                raise ValueError(f"{name} has {length} entries for {n} ids")
        problem = first_non_finite(self)
        if problem is not None:
            raise ValueError(problem)
        known = set(self.ids)
        for name, said in self.details.items():
            strays = [item_id for item_id in said if item_id not in known]
            if strays:
                raise ValueError(f"details[{name!r}] name ids {strays[:5]} that are not the items'")
        for index, (ok, error) in enumerate(zip(self.successes, self.errors, strict=True)):
            if ok == (error is not None):
                raise ValueError(
                    f"item {self.ids[index]!r}: success {ok} with error {error!r} (one says "
                    f"the other)"
                )
        failed = {
            (failure.term, item_id) for failure in self.term_failures for item_id in failure.ids
        }
        for term, values in self.component_rewards.items():
            mask = self.applicable.get(term)
            for index, value in enumerate(values):
                expected_none = (mask is not None and not mask[index]) or (
                    term,
                    self.ids[index],
                ) in failed
                if (value is None) != expected_none:
                    raise ValueError(
                        f"component_rewards[{term!r}][{index}] (id={self.ids[index]!r}) is "
                        f"{value!r}, but the term "
                        f"{'does not apply or failed' if expected_none else 'applies and succeeded'}"  # noqa: E501
                    )
        return self

    def usable(self) -> list[bool]:
        """Per item, whether a trainer may use its reward: a success, or short of an optional term
        only (a scorer's own term failure is not one: nobody said the term was optional)."""
        unknown = {
            item_id for f in self.term_failures if f.kind == SCORER_TERM_FAILED for item_id in f.ids
        }
        optional = {item_id for f in self.term_failures for item_id in f.ids} - unknown
        return [
            ok or item_id in optional for ok, item_id in zip(self.successes, self.ids, strict=True)
        ]

    @classmethod
    def checked(cls, **fields: Any) -> RewardResponse:
        """Build one from combined values (a panel's sums, a backend's weighted terms): a value
        that breaks the contract (a non-finite sum) raises RewardContractError, never a NaN
        reward."""
        try:
            return cls(**fields)
        except ValueError as exc:  # pydantic's ValidationError
            raise RewardContractError(validation_message(exc)) from exc

    def details_for(self, item_id: str) -> dict[str, dict[str, Any]]:
        """What each scorer said of one item ({scorer: details}; empty where none said anything)."""
        return {name: said[item_id] for name, said in self.details.items() if item_id in said}

    def metrics(self, namespace: str = "train") -> dict[str, float]:
        """Diagnostics as `<namespace>/reward/<term>/<diagnostic>` plus each term's sample_count."""
        return to_metrics(self.diagnostics, namespace)
