"""Misbehaving and probing scorers, loaded in real children by dotted path."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence

from scorers.base import ScoreItem, Scorer, ScoreResult, ScorerSpec


def _spec(name: str) -> ScorerSpec:
    return ScorerSpec(name=name, input_kind="text", terms=(name,), env="image")


class Probe(Scorer):
    """len(text) per item; counts its calls; optional sleep per call; 'offloads'.

    With `journal`, appends one line per call to that file: its pid, then the batch's ids
    (so tests see how a request was cut into calls, and by which process). With `hold`, every call
    after the first waits while that file exists (a run the test keeps going until it says so)."""

    spec = ScorerSpec(
        name="probe",
        input_kind="text",
        terms=("probe",),
        env="image",
        supports_offload=True,
        diagnostics=("calls",),
    )

    def __init__(
        self, sleep_s: float = 0.0, journal: str | None = None, hold: str | None = None
    ) -> None:
        self.sleep_s = sleep_s
        self.journal = journal
        self.hold = hold
        self.calls = 0

    def score(self, items: Sequence[ScoreItem]) -> ScoreResult:
        if self.sleep_s:
            time.sleep(self.sleep_s)
        self.calls += 1
        while self.hold is not None and self.calls > 1 and os.path.exists(self.hold):
            time.sleep(0.01)
        if self.journal is not None:
            with open(self.journal, "a") as handle:
                handle.write(" ".join([str(os.getpid()), *(item.id for item in items)]) + "\n")
        return ScoreResult(
            terms={"probe": [float(len(item.text or "")) for item in items]},
            diagnostics={"calls": 1},
        )


def journal_calls(path: str) -> list[tuple[int, list[str]]]:
    """A Probe journal as (pid, ids) per call, in call order."""
    with open(path) as handle:
        lines = [line.split() for line in handle.read().splitlines()]
    return [(int(line[0]), line[1:]) for line in lines]


class LoadFails(Scorer):
    spec = _spec("load_fails")

    def load(self, device: str = "cpu") -> None:
        raise RuntimeError("weights file /models/missing.safetensors not found")


class LoadHangs(Scorer):
    spec = _spec("load_hangs")

    def load(self, device: str = "cpu") -> None:
        time.sleep(3600)


class ExitsOnLoad(Scorer):
    spec = _spec("exits_on_load")

    def load(self, device: str = "cpu") -> None:
        os._exit(17)


class Raises(Scorer):
    spec = _spec("raises")

    def score(self, items: Sequence[ScoreItem]) -> ScoreResult:
        raise ZeroDivisionError("scorer bug on purpose")


class ReturnsNaN(Scorer):
    spec = _spec("returns_nan")

    def score(self, items: Sequence[ScoreItem]) -> ScoreResult:
        return ScoreResult(terms={"returns_nan": [float("nan")] + [1.0] * (len(items) - 1)})


class WrongCount(Scorer):
    spec = _spec("wrong_count")

    def score(self, items: Sequence[ScoreItem]) -> ScoreResult:
        return ScoreResult(terms={"wrong_count": [1.0] * (len(items) + 1)})


class BadDiagnostics(Scorer):
    """Diagnostics that JSON cannot carry: must be a typed contract error, not a dropped
    connection."""

    spec = ScorerSpec(
        name="bad_diagnostics", input_kind="text", terms=("bad_diagnostics",), diagnostics=("mean",)
    )

    def score(self, items: Sequence[ScoreItem]) -> ScoreResult:
        import numpy as np

        if items[0].text == "bad":
            return ScoreResult(
                terms={"bad_diagnostics": [1.0] * len(items)}, diagnostics={"mean": np.float32(1)}
            )
        if items[0].text == "undeclared":
            return ScoreResult(
                terms={"bad_diagnostics": [1.0] * len(items)}, diagnostics={"surprise": 1}
            )
        return ScoreResult(terms={"bad_diagnostics": [2.0] * len(items)})


class NoOffloadMarksLoad(Scorer):
    """Cannot offload; load() leaves a marker file, so a test can prove load never ran."""

    spec = _spec("no_offload_marks_load")

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def load(self, device: str = "cpu") -> None:
        with open(self.marker, "w") as handle:
            handle.write("loaded")

    def score(self, items: Sequence[ScoreItem]) -> ScoreResult:
        return ScoreResult(terms={"no_offload_marks_load": [0.5] * len(items)})


class Journal(Scorer):
    """Appends every id it is asked to score to a file before scoring: proves nothing is sent twice.
    On cue in the first item's text: 'slow' sleeps `sleep_s`, 'raise' fails after journaling."""

    spec = _spec("journal")

    def __init__(self, path: str, sleep_s: float = 0.0) -> None:
        self.path, self.sleep_s = path, sleep_s

    def score(self, items: Sequence[ScoreItem]) -> ScoreResult:
        with open(self.path, "a") as handle:
            handle.write("".join(f"{item.id}\n" for item in items))
        time.sleep(self.sleep_s if items[0].text == "slow" else 0.0)
        if items[0].text == "raise":
            raise RuntimeError("journal scorer fails on cue")
        return ScoreResult(terms={"journal": [1.0] * len(items)})


class BootsOnce(Scorer):
    """Loads the first time; every later boot fails (a marker file remembers): a restart that cannot
    boot."""

    spec = _spec("boots_once")

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def load(self, device: str = "cpu") -> None:
        if os.path.exists(self.marker):
            raise RuntimeError("checkpoint vanished since the first boot")
        with open(self.marker, "w") as handle:
            handle.write("booted")

    def score(self, items: Sequence[ScoreItem]) -> ScoreResult:
        return ScoreResult(terms={"boots_once": [1.0] * len(items)})


class Flaky(Scorer):
    """len(text), except on cue: 'raise' raises, 'nan' returns NaN, 'count' one score too many,
    'slow' sleeps 30 s."""

    spec = _spec("flaky")

    def score(self, items: Sequence[ScoreItem]) -> ScoreResult:
        cue = items[0].text
        if cue == "slow":
            time.sleep(30)
        if cue == "raise":
            raise ZeroDivisionError("scorer bug on cue")
        values = [float(len(item.text or "")) for item in items]
        if cue == "nan":
            values[0] = float("nan")
        if cue == "count":
            values.append(0.0)
        return ScoreResult(terms={"flaky": values})


class TwoTermImage(Scorer):
    """An image scorer with two terms (a reward and a penalty)."""

    spec = ScorerSpec(
        name="two_term_image",
        input_kind="image",
        required_fields=("image",),
        terms=("aesthetic", "penalty"),
    )

    def score(self, items: Sequence[ScoreItem]) -> ScoreResult:
        return ScoreResult(terms={"aesthetic": [0.9] * len(items), "penalty": [-5.0] * len(items)})


class OnloadFailsOnce(Scorer):
    """Offloadable; the first onload raises halfway: residency must become 'unknown', not stay a
    lie."""

    spec = ScorerSpec(
        name="onload_fails_once",
        input_kind="text",
        terms=("onload_fails_once",),
        supports_offload=True,
    )

    def __init__(self) -> None:
        self.onloads = 0

    def onload(self) -> dict:
        self.onloads += 1
        if self.onloads == 2:  # boot onload succeeds, the next one fails
            raise RuntimeError("CUDA out of memory (simulated) while moving layer 3")
        return {"onloads": self.onloads}

    def score(self, items: Sequence[ScoreItem]) -> ScoreResult:
        return ScoreResult(terms={"onload_fails_once": [1.0] * len(items)})


def _array_inputs(items: Sequence[ScoreItem], field: str = "image") -> dict:
    """How the child handed the arrays of `field` over: writable? backed by what?"""
    bases = []
    for item in items:
        base = getattr(item, field)
        while getattr(base, "base", None) is not None and not isinstance(
            base, (bytes, bytearray, memoryview)
        ):
            base = base.base
        obj = base.obj if isinstance(base, memoryview) else base
        bases.append(type(obj).__name__)
    return {
        "writeable": sum(bool(getattr(item, field).flags.writeable) for item in items),
        "mmap_backed": bases.count("mmap"),
        "bytes_backed": bases.count("bytes"),
    }


_INPUT_DIAGNOSTICS = ("writeable", "mmap_backed", "bytes_backed")


class InputProbe(Scorer):
    """Mean pixel per item; diagnostics say whether inputs were writable and what memory backs them.
    With `sleep_s` it sleeps before reading the pixels (a request that stays in flight)."""

    spec = ScorerSpec(
        name="input_probe",
        input_kind="image",
        required_fields=("image",),
        terms=("input_probe",),
        diagnostics=_INPUT_DIAGNOSTICS,
    )

    def __init__(self, sleep_s: float = 0.0) -> None:
        self.sleep_s = sleep_s

    def score(self, items: Sequence[ScoreItem]) -> ScoreResult:
        time.sleep(self.sleep_s)
        return ScoreResult(
            terms={"input_probe": [float(item.image.mean()) for item in items]},
            diagnostics=_array_inputs(items),
        )


class WritesInputs(InputProbe):
    """Zeroes its input in place (so it declares writable_inputs), then scores the mean: always
    0."""

    spec = ScorerSpec(
        name="writes_inputs",
        input_kind="image",
        required_fields=("image",),
        terms=("writes_inputs",),
        writable_inputs=True,
        diagnostics=_INPUT_DIAGNOSTICS,
    )

    def score(self, items: Sequence[ScoreItem]) -> ScoreResult:
        for item in items:
            item.image[...] = 0
        return ScoreResult(
            terms={"writes_inputs": [float(item.image.mean()) for item in items]},
            diagnostics=_array_inputs(items),
        )


class WritesWithoutSaying(InputProbe):
    """Writes into its input without declaring it: must fail loudly, never corrupt shared memory."""

    spec = ScorerSpec(
        name="writes_without_saying",
        input_kind="image",
        required_fields=("image",),
        terms=("writes_without_saying",),
    )

    def score(self, items: Sequence[ScoreItem]) -> ScoreResult:
        items[0].image[0, 0, 0] = 1
        return ScoreResult(terms={"writes_without_saying": [0.0] * len(items)})


class ConstructorRaises(Scorer):
    """A constructor that fails in a way no params check anticipates."""

    spec = _spec("constructor_raises")

    def __init__(self) -> None:
        raise RuntimeError("no GPU driver loaded")


# -- custom catalogs and identity probes ------------------------------------------------------
# (tests/contract/test_identity.py, tests/ops/test_preflight.py)
from scorers.pointwise import map_candidates  # appended section: its own import


def keyword_hit(
    candidate: ScoreItem, context, keyword: str = "yes", api_key_env: str = "FIXTURE_JUDGE_KEY"
) -> float:
    """1.0 when the completion mentions `keyword`. `api_key_env` is a credential *reference* (an env
    var name, as a judge API scorer takes): it is a param, the key itself never is."""
    if not os.environ.get(api_key_env):
        raise RuntimeError(
            f"keyword: environment variable {api_key_env} (the judge's key) is not set"
        )
    return float(keyword.lower() in (candidate.text or "").lower())


Keyword = map_candidates(keyword_hit, name="keyword", revision="kw-1")


def catalog() -> dict:
    """A zero-argument catalog factory adding one scorer by class and one by `module:Class` path."""
    return {"keyword": Keyword, "keyword_by_path": "tests.helpers.fixture_scorers:Keyword"}


def overriding_catalog() -> dict:
    return {"keyword": Keyword, "exact_match": Keyword}


def catalog_needing_args(prefix: str) -> dict:
    return {f"{prefix}keyword": Keyword}


def catalog_not_a_mapping() -> list:
    return [("keyword", Keyword)]


def catalog_of_a_non_scorer() -> dict:
    return {"keyword": dict}


def catalog_of_a_path_to_a_non_scorer() -> dict:
    return {"keyword": "tests.helpers.fixture_scorers:journal_calls"}


class DiagnosticsOnCue(Scorer):
    """len(text) per item, with diagnostics chosen by the first item's text: 'ok' reports a declared
    count and mean; the other cues break the diagnostics contract one way each."""

    spec = ScorerSpec(
        name="diagnostics_on_cue",
        input_kind="text",
        terms=("diagnostics_on_cue",),
        diagnostics=("empties", "length"),
    )
    CUES = {
        "undeclared": {"surprise": 1},
        "string": {"empties": "none"},
        "nan": {"empties": float("nan")},
        "bool": {"empties": True},
        "list": {"length": [1.0, 2.0]},
        "mean_keys": {"length": {"total": 3.0, "count": 1}},
        "mean_count": {"length": {"sum": 3.0, "count": -1}},
        "mean_inf": {"length": {"sum": float("inf"), "count": 1}},
    }

    def score(self, items: Sequence[ScoreItem]) -> ScoreResult:
        from scorers.diagnostics import mean

        lengths = [float(len(item.text or "")) for item in items]
        cue = items[0].text or ""
        diagnostics = self.CUES.get(
            cue, {"empties": lengths.count(0.0), "length": mean(sum(lengths), len(lengths))}
        )
        return ScoreResult(terms={"diagnostics_on_cue": lengths}, diagnostics=diagnostics)


class EchoFields(Scorer):
    """Echoes what reached it as terms: token count, the truncation verdict, the dataset tag's
    length, and the pixel sums of the conditioning media (exact: the data plane is lossless)."""

    spec = ScorerSpec(
        name="echo_fields",
        input_kind="text",
        terms=("tokens", "truncated", "source_len", "condition_sum", "condition_count"),
    )

    def score(self, items: Sequence[ScoreItem]) -> ScoreResult:
        def media_sum(item: ScoreItem) -> float:
            return float(
                sum(int(a.sum()) for a in (*item.condition_images, *item.condition_videos))
            )

        return ScoreResult(
            terms={
                "tokens": [
                    float(-1 if item.completion_tokens is None else item.completion_tokens)
                    for item in items
                ],
                "truncated": [float(item.is_length_truncated) for item in items],
                "source_len": [float(len(item.data_source or "")) for item in items],
                "condition_sum": [media_sum(item) for item in items],
                "condition_count": [
                    float(len(item.condition_images) + len(item.condition_videos)) for item in items
                ],
            }
        )


class GroupSpy(Scorer):
    """Groupwise: each candidate scores the size of the group it arrived in; it also tries to
    mutate the shared context and reports (term `frozen`) whether that was refused."""

    spec = ScorerSpec(
        name="group_spy", input_kind="text", terms=("group_size", "frozen"), groupwise=True
    )

    def score_group(self, candidates, context):
        try:
            context.reference["answer"] = "tampered"
            frozen = 0.0
        except TypeError:
            frozen = 1.0
        if any(candidate.group_id != context.group_id for candidate in candidates):
            raise AssertionError("a candidate of another group was handed over")
        return ScoreResult(
            terms={
                "group_size": [float(len(candidates))] * len(candidates),
                "frozen": [frozen] * len(candidates),
            }
        )


# -- panels (tests/contract/test_panel.py, tests/contract/test_panel_property.py) ------------------
import hashlib  # appended section: its own imports

from scorers.base import ScoreInputError


def salted_value(salt: int, item_id: str) -> float:
    """A pure function of (salt, id): k / 1024 with |k| <= 2**20, so weighted sums of a few are
    exact."""
    digest = hashlib.sha256(f"{salt}:{item_id}".encode()).digest()
    return (int.from_bytes(digest[:4], "big") % (1 << 21) - (1 << 20)) / 1024.0


def salted(candidate: ScoreItem, context, salt: int = 0, poison: Sequence[str] = ()) -> float:
    """`salted_value(salt, id)`; an id in `poison` fails the whole call with a bad-input error."""
    if candidate.id in poison:
        raise ScoreInputError(f"item {candidate.id!r} is poison to salted(salt={salt})")
    return salted_value(salt, candidate.id)


Salted = map_candidates(salted, name="salted")


class Rendezvous(Scorer):
    """1.0 per item, once both sides arrived: creates `arrive`, then waits (at most `timeout_s`) for
    `other`. Two of them with crossed paths, on two backends (even in two processes), only finish
    when they are called at the same time; called one after the other, the first one times out."""

    spec = _spec("rendezvous")

    def __init__(self, arrive: str, other: str, timeout_s: float = 5.0) -> None:
        self.arrive, self.other, self.timeout_s = arrive, other, timeout_s

    def score(self, items: Sequence[ScoreItem]) -> ScoreResult:
        with open(self.arrive, "w") as handle:
            handle.write(str(os.getpid()))
        deadline = time.monotonic() + self.timeout_s
        while not os.path.exists(self.other):
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"{self.other} never appeared: the other scorer was not called meanwhile"
                )
            time.sleep(0.005)
        return ScoreResult(terms={"rendezvous": [1.0] * len(items)})


class Exclusive(Scorer):
    """Fails if two calls are ever inside it at once (scorers are not thread-safe)."""

    spec = ScorerSpec(name="exclusive", input_kind="text", terms=("exclusive",))
    inside = 0

    def score(self, items: Sequence[ScoreItem]) -> ScoreResult:
        Exclusive.inside += 1
        try:
            if Exclusive.inside > 1:
                raise AssertionError("two calls inside one scorer at once")
            time.sleep(0.05)
            return ScoreResult(terms={"exclusive": [1.0] * len(items)})
        finally:
            Exclusive.inside -= 1


class ProbeV2(Probe):
    """The probe at a new revision: what a scorer update looks like to an output being resumed."""

    spec = ScorerSpec(
        name="probe",
        input_kind="text",
        terms=("probe",),
        env="image",
        diagnostics=("calls",),
        revision="probe-v2",
    )


class RefusesText(Scorer):
    """len(text), but an item whose text is `poison` is refused (bad input) with the whole batch;
    'offloads'."""

    spec = ScorerSpec(
        name="refuses_text",
        input_kind="text",
        terms=("refuses_text",),
        env="image",
        supports_offload=True,
        nonsemantic_params=("while_exists",),
    )

    def __init__(self, poison: str = "poison", while_exists: str | None = None) -> None:
        self.poison = poison
        self.while_exists = while_exists  # a transient failure: refused only while this file exists

    def score(self, items: Sequence[ScoreItem]) -> ScoreResult:
        active = self.while_exists is None or os.path.exists(self.while_exists)
        for item in items:
            if active and item.text == self.poison:
                raise ScoreInputError(f"item {item.id!r} is poison")
        return ScoreResult(terms={"refuses_text": [float(len(item.text or "")) for item in items]})


class WhereScored(Scorer):
    """Which child scored each item: its pid, and the GPU it was narrowed to (-1: none)
    (replicas)."""

    spec = ScorerSpec(name="where_scored", input_kind="text", terms=("pid", "device"), env="image")

    def __init__(self, sleep_s: float = 0.0) -> None:
        self.sleep_s = sleep_s

    def score(self, items: Sequence[ScoreItem]) -> ScoreResult:
        time.sleep(self.sleep_s)
        device = float(os.environ.get("CUDA_VISIBLE_DEVICES") or -1)
        return ScoreResult(
            terms={"pid": [float(os.getpid())] * len(items), "device": [device] * len(items)}
        )


class FailsMarked(Scorer):
    """len(text), except items whose text contains "fail": those it cannot score
    (ScoreResult.failed). With `bad_position`, it names a position outside the batch (a contract
    violation)."""

    spec = ScorerSpec(name="fails_marked", input_kind="text", terms=("fails_marked",), env="image")

    def __init__(self, bad_position: bool = False) -> None:
        self.bad_position = bad_position

    def score(self, items: Sequence[ScoreItem]) -> ScoreResult:
        failed = {
            i: f"no score for {item.text!r}"
            for i, item in enumerate(items)
            if "fail" in (item.text or "")
        }
        if self.bad_position:
            failed[len(items)] = "out of the batch"
        values = [
            float("nan") if i in failed else float(len(item.text or ""))
            for i, item in enumerate(items)
        ]
        return ScoreResult(terms={"fails_marked": values}, failed=failed)


class AudioEcho(Scorer):
    """Echoes each item's audio as terms: a checksum of its bytes (the first 6 bytes of their
    sha256, exact as a float), its channels, samples and sample rate; diagnostics say what backs the
    arrays."""

    spec = ScorerSpec(
        name="audio_echo",
        input_kind="audio",
        required_fields=("audio",),
        terms=("checksum", "channels", "samples", "rate"),
        diagnostics=_INPUT_DIAGNOSTICS,
    )

    def score(self, items: Sequence[ScoreItem]) -> ScoreResult:
        waves = [item.required_audio() for item in items]
        return ScoreResult(
            terms={
                "checksum": [audio_checksum(audio) for audio, _ in waves],
                "channels": [float(audio.shape[0]) for audio, _ in waves],
                "samples": [float(audio.shape[1]) for audio, _ in waves],
                "rate": [float(rate) for _, rate in waves],
            },
            diagnostics=_array_inputs(items, "audio"),
        )


def audio_checksum(audio) -> float:
    """The first 6 bytes of the sha256 of the waveform's float32 bytes, as an exact float."""
    return float(int.from_bytes(hashlib.sha256(audio.tobytes()).digest()[:6], "big"))


class GreyLevels(Scorer):
    """An image's mean level v in [0, 1] as three terms: `half` (v / 2, its reward), `bright` (v)
    and `dark` (1 - v): a reward with several sub-metrics, for UniRL's weights and reductions."""

    spec = ScorerSpec(
        name="grey_levels",
        input_kind="image",
        terms=("half", "bright", "dark"),
        reward_term="half",
        env="image",
    )

    def score(self, items: Sequence[ScoreItem]) -> ScoreResult:
        levels = [float(item.required_image().mean()) / 255 for item in items]
        return ScoreResult(
            terms={
                "half": [v / 2 for v in levels],
                "bright": levels,
                "dark": [1 - v for v in levels],
            }
        )
