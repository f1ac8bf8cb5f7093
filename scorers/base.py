"""The scorer authoring contract, shared by in-process and managed execution.

A scorer turns a batch of `ScoreItem`s (pointwise) or one complete group
(groupwise) into one finite float per item for each of its terms. Everything here is stdlib + numpy
so any scorer env can import it through the import root the parent gives it, without installing
managed-scorers. numpy is imported by what handles arrays, not here: a child that scores text never
imports it.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import ModuleType
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    import numpy as np

from scorers.details import DetailsError, check_detail
from scorers.diagnostics import DiagnosticsError, check_values, merge_values
from scorers.groups import GroupContext, GroupInputError, context_of, freeze, partition
from scorers.identity import effective_params


def numpy_if_imported() -> ModuleType | None:
    """numpy, if this process has imported it: only then can an object be one of its arrays or
    scalars."""
    return sys.modules.get("numpy")


def _is_number(value: Any) -> bool:
    """A Python or numpy real number (bools are ints)."""
    if isinstance(value, (int, float)):
        return True
    numpy = numpy_if_imported()
    return numpy is not None and isinstance(value, (numpy.floating, numpy.integer))


def is_length_verdict(finish_reason: str | None) -> bool:
    """The one truncation test shared by scorers and the service: exactly "length"."""
    return finish_reason == "length"


class ScorerContractError(RuntimeError):
    """A scorer returned something other than one finite score per item."""


class ScoreInputError(ValueError):
    """An item lacks what the scorer needs (answered 4xx by the child)."""


class ScorerWedged(RuntimeError):
    """This process can score no more: a call passed its deadline with work still running on a
    thread the scorer cannot stop. `timed_out`: this call's own deadline passed (False: it never
    started, queued behind that work or arriving after it). A child answers 503 `wedged` /
    `wedged_queued`; its managed parent kills it and the next call restarts it under the restart
    policy, as after a crash."""

    def __init__(self, message: str, timed_out: bool = True) -> None:
        super().__init__(message)
        self.timed_out = timed_out


class ServerFault(RuntimeError):
    """The scorer could not score for a fault of this server, not of the request (a child it runs
    died, timed out, cannot start or wake): answered 503 `server_fault`, which a client of several
    servers fails over on. A scorer's own refusal stays a 500 `scorer_error` (the same request fails
    anywhere)."""


class CloseFailed(RuntimeError):
    """A model's close() raised as it was put to sleep, but the model was released all the same: the
    offload happened (the host records the scorer offloaded) and the answer is 500 `close_failed`,
    the model's error, not a failed residency change."""


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
    diagnostics: tuple[str, ...] = ()  # the only diagnostic names `score` may report
    # the only keys an item's details may hold (`scorers.details`: reporting, per item)
    details: tuple[str, ...] = ()
    identity: Any = None  # optional JSON semantic identity (judge prompt hash, model digest...)
    # Groupwise scorers get one complete group per call (`score_group`, see scorers.groups).
    groupwise: bool = False
    ragged_groups: bool = False  # a groupwise scorer that accepts groups of any size
    # a groupwise scorer that scores each candidate on its own (`map_candidates`): a group may be
    # scored in parts (a stream's windows, one sample per call) without changing a reward
    per_candidate: bool = False
    # Params that never change a verdict or a failure (worker counts): left out of the identity
    # hash.
    nonsemantic_params: tuple[str, ...] = ()
    # Top-level modules the scorer imports from its env (preflight looks for them there).
    requires_modules: tuple[str, ...] = ()
    # How many score() calls it takes at once (the chunks of one request are sent together, up to
    # this many): more than 1 only for a scorer whose score() is thread-safe and whose calls gain
    # from overlapping (math_verify's pool shares its workers, so the chunks' slow items share one
    # timeout).
    concurrent_calls: int = 1
    # The term that is the scorer's reward by itself (a served panel's weighted reward); None: the
    # reward is its terms' sum (weighted by the client).
    reward_term: str | None = None

    def term_names(self) -> tuple[str, ...]:
        return self.terms or (self.name,)

    @property
    def whole_groups(self) -> bool:
        """Whether scoring a group's candidates apart could change a reward: a groupwise scorer
        that compares them."""
        return self.groupwise and not self.per_candidate


@dataclass
class ScoreItem:
    """One rollout as a scorer sees it (decoded from the wire or built locally).

    Its fields are those `scorers.item_fields` declares, in that order with those defaults: a
    dataclass written out for type checkers and for pickling into grading workers, held to the
    declaration by tests/contract/test_item_fields.py."""

    id: str
    group_id: str | None = None
    prompt: str | None = None
    text: str | None = None
    image: np.ndarray | None = None  # uint8 HWC
    video: np.ndarray | None = None  # uint8 THWC
    reference: Any = None
    metadata: dict[str, Any] = field(default_factory=dict)
    # the generation engine's verbatim verdict ("stop", "length", ...)
    finish_reason: str | None = None
    completion_tokens: int | None = None
    data_source: str | None = None  # the dataset tag (verl's data_source)
    condition_images: tuple[np.ndarray, ...] = ()  # e.g. an edit reward's source image(s)
    condition_videos: tuple[np.ndarray, ...] = ()
    audio: np.ndarray | None = None  # float32 (channels, samples), every sample finite
    audio_sample_rate: int | None = None  # Hz; set exactly when audio is

    @property
    def is_length_truncated(self) -> bool:
        """True only when the engine said "length"; None means not known to be truncated."""
        return is_length_verdict(self.finish_reason)

    def required_text(self) -> str:
        """The text, which the scorer declared it needs (checked before `score` runs)."""
        return self._required("text", self.text)

    def required_image(self) -> np.ndarray:
        return self._required("image", self.image)

    def required_video(self) -> np.ndarray:
        return self._required("video", self.video)

    def required_audio(self) -> tuple[np.ndarray, int]:
        """The waveform and its sample rate (the wire checks guarantee the rate comes with it)."""
        return self._required("audio", self.audio), self._required(
            "audio_sample_rate", self.audio_sample_rate
        )

    def _required(self, name: str, value: Any) -> Any:
        if value is None:
            raise ScoreInputError(f"item {self.id!r}: field {name!r} is required")
        return value


@dataclass
class ScoreResult:
    """Per-term scores in item order, plus diagnostics (counts, timings).

    `failed` maps the position of an item the scorer could not score (a judge reply that does
    not parse) to why: its values are ignored and the item gets no reward from this scorer;
    a panel records it like an optional term's failure, anything else raises naming it.
    `term_failed` is the same for one term only (`{term: {position: why}}`): the item keeps its
    other terms (a scorer computing several independent functions, one of which failed).
    `not_applicable` names, per term, the positions that term does not apply to (a served panel's
    term limited to some data sources): no value there, and no failure either.
    `details` maps an item's position to what the scorer says of it (a small JSON object over the
    keys `spec.details` declares, see `scorers.details`): reporting only, kept with the item's id.
    """

    terms: dict[str, list[float]]
    diagnostics: dict[str, Any] = field(default_factory=dict)
    failed: dict[int, str] = field(default_factory=dict)
    term_failed: dict[str, dict[int, str]] = field(default_factory=dict)
    not_applicable: dict[str, set[int]] = field(default_factory=dict)
    details: dict[int, dict[str, Any]] = field(default_factory=dict)


class Scorer:
    """Base class: cheap constructor, weights in `load`, scoring in `score`.

    A pointwise scorer implements `score(items)`: one finite score per item, in order, for
    any chunk up to its batch size. A groupwise scorer sets `spec.groupwise` and implements
    `score_group(candidates, context)`: it gets exactly one complete group per call (see
    `scorers.groups`; `scorers.pointwise.map_candidates` lifts a per-candidate function).

    Media arrive as read-only views that are valid only until the call returns (in a
    managed child they live in the shared segment the next request reuses): copy any
    array you keep across calls, or declare `writable_inputs` to get private copies.
    """

    spec: ScorerSpec  # a class attribute, or set per instance by wrappers (video)
    # True where `spec` is set per instance from params (an FF or native model's, from its model
    # class) and the class attribute is a placeholder: the parent then infers nothing from it (env,
    # input kind)
    spec_per_instance: ClassVar[bool] = False
    # set by the host before load(): True where it onloads the scorer right after (a resident
    # scorer's boot), so a load() that would end by offloading may leave it loaded instead
    boots_resident: bool = False

    def __init__(self, **params: Any) -> None:
        if params:
            raise TypeError(f"{type(self).__name__} takes no params, got {sorted(params)}")

    def load(self, device: str = "cpu") -> None:
        """Load weights / start helpers. Called once before the first score."""

    def warming(self) -> bool:
        """True while something load() started in the background is not up yet (a math grader's
        workers): the first score() waits for it, so a managed child's parent gives that request
        what is left of the start-up budget, not just the request timeout. Read when the child says
        it is ready (and polled before that by `managed-scorers serve`, which says ready only once
        it is False)."""
        return False

    def onload(self) -> dict[str, Any]:
        return {}

    def offload(self) -> dict[str, Any]:
        return {}

    def score(self, items: Sequence[ScoreItem]) -> ScoreResult:
        raise NotImplementedError

    def score_group(self, candidates: Sequence[ScoreItem], context: GroupContext) -> ScoreResult:
        raise NotImplementedError(
            f"{type(self).__name__} declares groupwise but has no score_group"
        )

    def score_terms(self, items: Sequence[ScoreItem], terms: tuple[str, ...]) -> ScoreResult:
        """Only `terms` are wanted (a request named them): a scorer that can skip the others' work
        (a served panel) overrides this; by default every term is scored and the others dropped."""
        return self.score(items)

    def score_request(
        self, items: Sequence[ScoreItem], group_size: int | None, terms: tuple[str, ...] | None
    ) -> ScoreResult:
        """What a pointwise scorer is called with (groups already checked): `score`, or
        `score_terms` when the request named terms. A scorer that needs the request's declared group
        size (a served panel, whose own groupwise terms regroup the items) overrides this."""
        return self.score(items) if terms is None else self.score_terms(items, terms)

    def identity_params(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """The params as they decide verdicts (defaults applied); override to add resolved ones."""
        return effective_params(type(self), params)

    def close(self) -> None:
        """Release helpers (processes, memory). Must be bounded and idempotent."""


_COMPLETION_FIELDS = {
    "text": ("text",),
    "image": ("image",),
    "image_edit": ("image",),
    "video": ("video",),
    "audio": ("audio",),
}


def check_required_fields(spec: ScorerSpec, items: Sequence[ScoreItem]) -> None:
    """Refuse items without a completion of the scorer's kind, or missing a declared field."""
    completion = _COMPLETION_FIELDS.get(spec.input_kind, ())
    for index, item in enumerate(items):
        for name in completion:
            if getattr(item, name) is None:
                raise ScoreInputError(
                    f"items[{index}] (id={item.id!r}): field {name!r} is required by scorer "
                    f"{spec.name!r} (the completion of a {spec.input_kind} scorer is missing)"
                )
        if spec.input_kind == "image_edit" and not item.condition_images:
            raise ScoreInputError(
                f"items[{index}] (id={item.id!r}): image_edit scorer {spec.name!r} needs the "
                f"source image "
                "in condition_images"
            )
        for name in spec.required_fields:
            value = getattr(item, name)
            if value is None or (isinstance(value, tuple) and not value):
                raise ScoreInputError(
                    f"items[{index}] (id={item.id!r}): field {name!r} is required by scorer "
                    f"{spec.name!r}"
                )


def score_checked(
    scorer: Scorer,
    items: Sequence[ScoreItem],
    group_size: int | None = None,
    terms: Sequence[str] | None = None,
) -> ScoreResult:
    """The one way scorer code runs: inputs checked first, then one finite float per item and term.

    Groups are checked (and, for a groupwise scorer, scored one complete group per call)
    before any scorer code runs; see `scorers.groups.partition`. `terms`: only these of the
    scorer's terms are wanted (the result holds exactly them); None: all.
    """
    spec = scorer.spec
    wanted = wanted_terms(spec, terms)
    try:
        groups = partition(
            items, group_size, scorer=spec.name, groupwise=spec.groupwise, ragged=spec.ragged_groups
        )
    except GroupInputError as exc:
        raise ScoreInputError(str(exc)) from exc
    check_required_fields(spec, items)
    if not spec.groupwise:
        result = _checked_result(
            spec, scorer.score_request(items, group_size, wanted), items, wanted
        )
        return result if wanted is None else _selected(result, wanted)
    if wanted is not None:
        return _selected(score_checked(scorer, items, group_size), wanted)
    return _score_groups(scorer, items, groups)


def _score_groups(
    scorer: Scorer, items: Sequence[ScoreItem], groups: list[list[int]]
) -> ScoreResult:
    """A groupwise scorer called once per complete group, its results put back in item order."""
    spec = scorer.spec
    scores = {term: [0.0] * len(items) for term in spec.term_names()}
    reports, failed = [], {}
    term_failed: dict[str, dict[int, str]] = {}
    not_applicable: dict[str, set[int]] = {}
    details: dict[int, dict[str, Any]] = {}
    for members in groups:
        candidates = tuple(replace(items[i], reference=freeze(items[i].reference)) for i in members)
        part = _checked_result(
            spec, scorer.score_group(candidates, context_of(items, members)), candidates
        )
        for term, values in part.terms.items():
            for index, value in zip(members, values, strict=True):
                scores[term][index] = value
        reports.append(part.diagnostics)
        failed.update({members[position]: why for position, why in part.failed.items()})
        for term, whys in part.term_failed.items():
            term_failed.setdefault(term, {}).update(
                {members[position]: why for position, why in whys.items()}
            )
        for term, positions in part.not_applicable.items():
            not_applicable.setdefault(term, set()).update(
                members[position] for position in positions
            )
        details.update({members[position]: said for position, said in part.details.items()})
    return ScoreResult(scores, merge_values(reports), failed, term_failed, not_applicable, details)


def wanted_terms(spec: ScorerSpec, terms: Sequence[str] | None) -> tuple[str, ...] | None:
    """The terms a request names, checked against the scorer's (None: all of them)."""
    if terms is None:
        return None
    declared = spec.term_names()
    unknown = [term for term in terms if term not in declared]
    if unknown or not terms or len(set(terms)) != len(terms):
        raise ScoreInputError(
            f"terms {list(terms)} asked of scorer {spec.name!r}: name some of its terms "
            f"{list(declared)}, each once"
        )
    return tuple(terms)


def _selected(result: ScoreResult, wanted: tuple[str, ...]) -> ScoreResult:
    """The result narrowed to the wanted terms (a checked result: every one of them is there)."""
    return replace(
        result,
        terms={term: result.terms[term] for term in wanted},
        term_failed={term: whys for term, whys in result.term_failed.items() if term in wanted},
        not_applicable={
            term: where for term, where in result.not_applicable.items() if term in wanted
        },
    )


def _checked_result(
    spec: ScorerSpec, result: Any, items: Sequence[ScoreItem], wanted: tuple[str, ...] | None = None
) -> ScoreResult:
    """A result that keeps the contract; with `wanted`, it may leave out the terms nobody asked
    for."""
    if not isinstance(result, ScoreResult):
        raise ScorerContractError(
            f"scorer {spec.name!r} returned {type(result).__name__}, expected ScoreResult"
        )
    expected = set(spec.term_names())
    if not (set(wanted or expected) <= set(result.terms) <= expected):
        raise ScorerContractError(
            f"scorer {spec.name!r} returned terms {sorted(result.terms)}, declared "
            f"{sorted(expected)}" + (f" (asked for {list(wanted)})" if wanted else "")
        )
    _check_failed(spec, "failed", result.failed, len(items))
    if not isinstance(result.term_failed, dict) or set(result.term_failed) - expected:
        raise ScorerContractError(
            f"scorer {spec.name!r}: term_failed must map its terms to failures"
        )
    for term, whys in result.term_failed.items():
        _check_failed(spec, f"term_failed[{term!r}]", whys, len(items))
    _check_not_applicable(spec, result.not_applicable, len(items))
    for term, values in result.terms.items():
        if len(values) != len(items):
            raise ScorerContractError(
                f"scorer {spec.name!r} term {term!r}: {len(values)} scores for {len(items)} items"
            )
        unscored = (
            result.failed.keys()
            | result.term_failed.get(term, {}).keys()
            | result.not_applicable.get(term, set())
        )
        for index, value in enumerate(values):
            if index in unscored:
                continue
            if not _is_number(value) or not math.isfinite(value):
                raise ScorerContractError(
                    f"scorer {spec.name!r} term {term!r}: non-finite score {value!r} "
                    f"for items[{index}] (id={items[index].id!r})"
                )
        # a failed item's value never travels as a number: NaN, refused anywhere it is not marked
        # failed
        result.terms[term] = [math.nan if i in unscored else float(v) for i, v in enumerate(values)]
    try:
        result.diagnostics = check_values(spec.name, spec.diagnostics, result.diagnostics)
    except DiagnosticsError as exc:
        raise ScorerContractError(str(exc)) from exc
    result.details = _checked_details(spec, result.details, items)
    return result


def _checked_details(spec: ScorerSpec, given: Any, items: Sequence[ScoreItem]) -> dict[int, Any]:
    """Item positions to details over the declared keys (`scorers.details`)."""
    if not isinstance(given, dict) or not all(
        isinstance(p, int) and 0 <= p < len(items) for p in given
    ):
        raise ScorerContractError(
            f"scorer {spec.name!r}: details must map item positions (0..{len(items) - 1}) to "
            "mappings"
        )
    try:
        return {
            position: check_detail(
                spec.name, spec.details, f"items[{position}] (id={items[position].id!r})", said
            )
            for position, said in given.items()
        }
    except DetailsError as exc:
        raise ScorerContractError(str(exc)) from exc


def _check_not_applicable(spec: ScorerSpec, given: Any, count: int) -> None:
    """Positions per declared term; never the scorer's reward term (a reward always applies)."""
    terms = set(spec.term_names())
    if not isinstance(given, dict) or set(given) - terms or spec.reward_term in given:
        raise ScorerContractError(
            f"scorer {spec.name!r}: not_applicable must map its terms (not its reward) to items"
        )
    for term, positions in given.items():
        if not isinstance(positions, (set, frozenset, list, tuple)) or not all(
            isinstance(p, int) and 0 <= p < count for p in positions
        ):
            raise ScorerContractError(
                f"scorer {spec.name!r}: not_applicable[{term!r}] must hold item positions "
                f"(0..{count - 1})"
            )
        given[term] = set(positions)


def _check_failed(spec: ScorerSpec, what: str, failed: Any, count: int) -> None:
    if not isinstance(failed, dict) or not all(
        isinstance(k, int) and 0 <= k < count and isinstance(v, str) and v
        for k, v in failed.items()
    ):
        raise ScorerContractError(
            f"scorer {spec.name!r}: {what} must map item positions (0..{count - 1}) to "
            f"reasons, got {failed!r}"
        )


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
        "reference must be a string, a number, or an object with 'answer', 'ground_truth' or "
        "'target'"
    )
