"""Scorer registry resolution, and the rule / JPEG scorers through the in-process backend."""

from __future__ import annotations

import io
import re
import sys

import numpy as np
import pytest
from PIL import Image

from scorers.base import Scorer
from scorers.builtin.jpeg import JpegCompressibility, JpegIncompressibility, jpeg_size_kb
from scorers.builtin.rules import Constant, ExactMatch, NonEmpty, normalize_text
from scorers.registry import UnknownScorerError, registered_names, resolve_scorer
from supervisor import LocalRewardBackend, RewardItem, RewardRequest, ScorerRequestError
from tests.helpers import fixture_scorers

REGISTERED = {
    "math_verify": "scorers.builtin.math_verify:MathVerifyScorer",
    "jpeg_compressibility": "scorers.builtin.jpeg:JpegCompressibility",
    "jpeg_incompressibility": "scorers.builtin.jpeg:JpegIncompressibility",
    "exact_match": "scorers.builtin.rules:ExactMatch",
    "mean_intensity": "scorers.builtin.rules:MeanIntensity",
    "edit_fidelity": "scorers.builtin.image_edit:EditFidelity",
    "nonempty": "scorers.builtin.rules:NonEmpty",
    "constant": "scorers.builtin.rules:Constant",
    "token_f1": "scorers.builtin.rules:TokenF1",
    "gsm8k": "scorers.builtin.task_rules:Gsm8k",
    "countdown": "scorers.builtin.task_rules:Countdown",
    "arithmetic": "scorers.builtin.task_rules:Arithmetic",
    "format_reward": "scorers.builtin.task_rules:FormatReward",
    "pairwise_judge": "scorers.builtin.pairwise:PairwiseJudge",
    "llm_judge": "scorers.builtin.llm_judge:LlmJudge",
    "text_similarity": "scorers.builtin.text_similarity:TextSimilarity",
    "clip_preference": "scorers.builtin.clip_preference:ClipPreference",
    "torch_probe": "scorers.builtin.torch_probe:TorchProbe",
    "ocr": "scorers.builtin.ocr:OcrScorer",
    "video": "scorers.builtin.video:VideoScorer",
    "audio_loudness": "scorers.builtin.audio:AudioLoudness",
    "code_exec": "scorers.builtin.code_exec:CodeExec",
}
CONSTRUCTION_PARAMS = {
    "video": {"inner": "jpeg_compressibility"},
    "pairwise_judge": {"inner": "token_f1"},
    "llm_judge": {"base_url": "http://127.0.0.1:9/v1", "model": "judge"},
    "clip_preference": {"model_dir": "/nonexistent/clip"},
}
HEAVY = ("math_verify", "sympy", "torch", "transformers", "PIL", "latex2sympy2_extended")


# -- registry --------------------------------------------------------------------------------
def test_registered_names_are_the_known_lowercase_set():
    assert registered_names() == sorted(REGISTERED)
    assert all(name == name.lower() for name in registered_names())


@pytest.mark.parametrize("name", sorted(REGISTERED))
def test_every_registered_name_resolves_to_its_scorer_class(name):
    before = set(sys.modules)
    cls = resolve_scorer(name)
    newly = set(sys.modules) - before
    module_name, _, attr = REGISTERED[name].partition(":")
    assert isinstance(cls, type) and issubclass(cls, Scorer) and cls is not Scorer
    assert cls.__module__ == module_name and cls.__name__ == attr
    assert cls.spec.name == name, "the registry key must be the scorer's own spec name"
    assert cls.spec.term_names() == (("win_rate",) if name == "pairwise_judge" else (name,))
    # resolving only imports the scorer module: weights and heavy libraries wait for load()
    heavy = sorted(m for m in newly if m.split(".")[0] in HEAVY)
    assert not heavy, f"resolving {name!r} imported {heavy}"


@pytest.mark.parametrize("name", sorted(REGISTERED))
def test_construction_is_cheap_and_imports_nothing_heavy(name):
    before = set(sys.modules)
    scorer = resolve_scorer(name)(**CONSTRUCTION_PARAMS.get(name, {}))
    try:
        heavy = sorted(m for m in set(sys.modules) - before if m.split(".")[0] in HEAVY)
        assert not heavy, f"constructing {name!r} imported {heavy}"
    finally:
        scorer.close()


@pytest.mark.parametrize(
    "spelling", ["EXACT_MATCH", "Exact_Match", "exact_match", "NonEmpty", "JPEG_Compressibility"]
)
def test_names_are_case_insensitive(spelling):
    assert resolve_scorer(spelling) is resolve_scorer(spelling.lower())


@pytest.mark.parametrize(
    "path", ["tests.helpers.fixture_scorers:Probe", "tests.helpers.fixture_scorers.Probe"]
)
def test_dotted_path_fallback(path):
    assert resolve_scorer(path) is fixture_scorers.Probe


def test_dotted_path_for_a_registered_module_also_works():
    assert resolve_scorer("scorers.builtin.rules:ExactMatch") is ExactMatch
    assert resolve_scorer("scorers.builtin.jpeg.JpegIncompressibility") is JpegIncompressibility


@pytest.mark.parametrize("name", ["exactmatch", "bleu", "Nope"])
def test_unknown_bare_name_lists_the_registered_names(name):
    with pytest.raises(UnknownScorerError) as info:
        resolve_scorer(name)
    text = str(info.value)
    assert f"unknown scorer {name!r}" in text
    assert "registered: " + ", ".join(sorted(REGISTERED)) in text
    assert "dotted path" in text


@pytest.mark.parametrize(
    "path,module",
    [
        ("no_such_pkg.rewards:MyScorer", "no_such_pkg.rewards"),
        ("no_such_pkg.rewards.MyScorer", "no_such_pkg.rewards"),
        ("tests.no_such_module:X", "tests.no_such_module"),
    ],
)
def test_unimportable_dotted_path_names_the_module(path, module):
    with pytest.raises(
        UnknownScorerError, match=f"scorer {path!r}: cannot import module {module!r}"
    ):
        resolve_scorer(path)


@pytest.mark.parametrize(
    "path",
    [
        "tests.helpers.fixture_scorers:Missing",
        "tests.helpers.fixture_scorers:ScorerSpec",
        "tests.helpers.fixture_scorers:_spec",
        "tests.helpers.fixture_scorers:Scorer.__init__",
    ],
)
def test_dotted_path_to_a_non_scorer(path):
    with pytest.raises(
        UnknownScorerError,
        match="is not a Scorer subclass|module 'tests.helpers.fixture_scorers' has no",
    ):
        resolve_scorer(path)


def test_unknown_scorer_error_is_a_lookup_error():
    assert issubclass(UnknownScorerError, LookupError)


# -- helpers for scoring through the backend -------------------------------------------------
def score(scorer, items, **kwargs):
    params = kwargs.pop("params", None)
    with LocalRewardBackend(scorer, params=params, **kwargs) as backend:
        response = backend.compute_rewards(RewardRequest(items=items))
    return response


def text_items(*pairs):
    return [RewardItem(id=f"i{n}", text=text, reference=ref) for n, (text, ref) in enumerate(pairs)]


# -- exact_match -----------------------------------------------------------------------------
def test_exact_match_normalises_case_whitespace_and_nfkc():
    items = text_items(
        ("42", "42"),
        ("  Hello \n\t World  ", "hello world"),
        ("ＡＢＣ１２３", "abc123"),  # fullwidth -> ASCII under NFKC
        ("ﬁne", "fine"),  # ligature
        ("STRASSE", "straße"),  # casefold, not lower()
        ("42", "43"),
        ("4 2", "42"),  # inner whitespace is collapsed, not removed
        ("", ""),
    )
    response = score("exact_match", items)
    assert response.rewards == [1.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 1.0]
    assert response.component_rewards == {"exact_match": response.rewards}
    assert response.ids == [f"i{n}" for n in range(8)]
    assert response.successes == [True] * 8


def test_exact_match_reference_forms():
    items = text_items(
        ("42", {"answer": "42"}),
        ("x", {"ground_truth": "X"}),
        ("y", {"target": "y"}),
        ("42", 42),
        ("2.5", 2.5),
        ("7", {"answer": {"answer": "7"}}),
        ("no", {"answer": "yes"}),
    )
    assert score("exact_match", items).rewards == [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.0]


def test_exact_match_case_sensitive():
    items = text_items(
        ("Hello  World", "Hello World"), ("hello world", "Hello World"), ("ＡＢ", "AB")
    )
    assert score("exact_match", items, params={"case_sensitive": True}).rewards == [1.0, 0.0, 1.0]
    assert score("exact_match", items).rewards == [1.0, 1.0, 1.0]


def test_exact_match_rejects_non_bool_case_sensitive():
    with pytest.raises(TypeError, match="case_sensitive must be a bool"):
        ExactMatch(case_sensitive="yes")
    with pytest.raises(TypeError):
        ExactMatch(strict=True)


@pytest.mark.parametrize(
    "item,message",
    [
        (
            RewardItem(id="a", text="x"),
            "items[0] (id='a'): field 'reference' is required by scorer 'exact_match'",
        ),
        (
            RewardItem(id="a", reference="x"),
            "items[0] (id='a'): field 'text' is required by scorer 'exact_match'",
        ),
        (
            RewardItem(id="a", text="x", reference=[1, 2]),
            "reference must be a string, a number, or an object",
        ),
        (
            RewardItem(id="a", text="x", reference={"gold": 1}),
            "reference must be a string, a number, or an object",
        ),
    ],
    ids=["no-reference", "no-text", "list-reference", "unknown-key-reference"],
)
def test_exact_match_bad_input_is_a_request_error(item, message):
    with pytest.raises(ScorerRequestError, match=re.escape(message)) as info:
        score("exact_match", [item])
    assert info.value.kind == "bad_input"


def test_normalize_text_directly():
    assert normalize_text("  A\u00a0B\u3000C  ", case_sensitive=False) == "a b c"
    assert normalize_text("  A\u00a0B  ", case_sensitive=True) == "A B"


# -- nonempty --------------------------------------------------------------------------------
def test_nonempty():
    items = [
        RewardItem(id=str(n), text=t) for n, t in enumerate(["x", "", "   \n\t", " a ", "\u3000"])
    ]
    response = score("nonempty", items)
    assert response.rewards == [1.0, 0.0, 0.0, 1.0, 0.0]
    assert response.component_rewards == {"nonempty": [1.0, 0.0, 0.0, 1.0, 0.0]}


def test_nonempty_requires_text():
    with pytest.raises(
        ScorerRequestError, match=r"items\[1\] \(id='b'\): field 'text' is required"
    ):
        score("nonempty", [RewardItem(id="a", text="x"), RewardItem(id="b")])


def test_nonempty_takes_no_params():
    with pytest.raises(TypeError, match="NonEmpty takes no params"):
        NonEmpty(anything=1)


# -- constant --------------------------------------------------------------------------------
@pytest.mark.parametrize("value,expected", [(None, 1.0), (0, 0.0), (-2.5, -2.5), (7, 7.0)])
def test_constant(value, expected):
    params = {} if value is None else {"value": value}
    items = [
        RewardItem(id="a", text=""),
        RewardItem(id="b", text="t"),
        RewardItem(id="c", prompt="p", text="u"),
    ]
    response = score("constant", items, params=params)
    assert response.rewards == [expected] * 3
    assert response.component_rewards == {"constant": [expected] * 3}


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf"), True, "1.0", None])
def test_constant_rejects_non_finite_values_at_construction(value):
    with pytest.raises(ValueError, match="value must be a finite number"):
        Constant(value=value)
    with pytest.raises(ValueError, match="value must be a finite number"):
        LocalRewardBackend("constant", params={"value": value})


# -- JPEG ------------------------------------------------------------------------------------
def q95_kb(image: np.ndarray, quality: int = 95) -> float:
    """Independent reference: the JPEG byte count at `quality`, in kB of 1000 bytes."""
    if image.shape[2] == 1:
        pil = Image.fromarray(image[:, :, 0])
    else:
        pil = Image.fromarray(image[:, :, :3])
    out = io.BytesIO()
    pil.save(out, format="JPEG", quality=quality)
    return len(out.getvalue()) / 1000.0


@pytest.fixture(scope="module")
def images() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    return {
        "flat": np.full((64, 64, 3), 128, dtype=np.uint8),
        "noise": rng.integers(0, 256, (64, 64, 3), dtype=np.uint8),
        "gradient": np.broadcast_to(
            np.linspace(0, 255, 64, dtype=np.uint8)[None, :, None], (64, 64, 3)
        ).copy(),
        "gray_noise": rng.integers(0, 256, (48, 32, 1), dtype=np.uint8),
        "rgba_noise": rng.integers(0, 256, (32, 40, 4), dtype=np.uint8),
    }


def test_jpeg_compressibility_prefers_flat_images(images):
    items = [
        RewardItem(id="flat", image=images["flat"]),
        RewardItem(id="noise", image=images["noise"]),
    ]
    response = score("jpeg_compressibility", items)
    flat, noise = response.rewards
    assert flat > noise
    assert flat < 0 and noise < 0
    assert noise < flat - 3.0  # 64x64 RGB noise at q95 is kilobytes larger than a flat field


def test_jpeg_values_match_an_independent_pil_computation(images):
    names = list(images)
    items = [RewardItem(id=n, image=images[n]) for n in names]
    compress = score("jpeg_compressibility", items)
    incompress = score("jpeg_incompressibility", items)
    expected = [q95_kb(images[n]) for n in names]
    assert compress.rewards == pytest.approx([-e for e in expected], abs=0, rel=0)
    assert incompress.rewards == pytest.approx(expected, abs=0, rel=0)
    assert incompress.rewards == [-c for c in compress.rewards]
    assert compress.component_rewards == {"jpeg_compressibility": compress.rewards}
    assert incompress.component_rewards == {"jpeg_incompressibility": incompress.rewards}


def test_jpeg_quality_param_changes_the_size(images):
    item = [RewardItem(id="n", image=images["noise"])]
    q50 = score("jpeg_incompressibility", item, params={"quality": 50}).rewards[0]
    q95 = score("jpeg_incompressibility", item).rewards[0]
    assert q50 == q95_kb(images["noise"], 50)
    assert q50 < q95


def test_jpeg_size_kb_helper(images):
    assert jpeg_size_kb(images["noise"], 95) == q95_kb(images["noise"])


def test_pil_images_are_accepted_by_reward_item(images):
    rgb = Image.fromarray(images["noise"])
    gray = Image.fromarray(images["gray_noise"][:, :, 0])
    a, b = RewardItem(id="rgb", image=rgb), RewardItem(id="gray", image=gray)
    assert a.image.shape == (64, 64, 3) and a.image.dtype == np.uint8
    assert b.image.shape == (48, 32, 1)
    np.testing.assert_array_equal(a.image, images["noise"])
    response = score("jpeg_compressibility", [a, b])
    assert response.rewards == [-q95_kb(images["noise"]), -q95_kb(images["gray_noise"])]


@pytest.mark.parametrize(
    "image",
    [
        np.zeros((4, 4, 3), dtype=np.float32),
        np.zeros((4, 4), dtype=np.uint8),
        np.zeros((4, 4, 2), dtype=np.uint8),
        [[0, 1]],
        "img.png",
    ],
    ids=["float", "2d-array", "2-channels", "list", "str"],
)
def test_reward_item_rejects_bad_images(image):
    with pytest.raises(ValueError, match="image must be"):
        RewardItem(id="a", image=image)


def test_a_video_is_not_an_image(images):
    video = np.stack([images["noise"], images["flat"]])
    with pytest.raises(
        ValueError,
        match=r"image must be uint8 HWC with 1, 3 or 4 channels, got uint8 \[2, 64, 64, 3\]",
    ):
        RewardItem(id="v", image=video)


def test_jpeg_requires_an_image():
    with pytest.raises(
        ScorerRequestError, match="field 'image' is required by scorer 'jpeg_incompressibility'"
    ):
        score("jpeg_incompressibility", [RewardItem(id="t", text="no image")])


@pytest.mark.parametrize("quality", [0, 101, -5, True, 95.0, "95", None])
@pytest.mark.parametrize("cls", [JpegCompressibility, JpegIncompressibility])
def test_bad_jpeg_quality_is_rejected(cls, quality):
    with pytest.raises(ValueError, match=r"quality must be an int in \[1, 100\]"):
        cls(quality=quality)


@pytest.mark.parametrize("quality", [1, 100])
def test_jpeg_quality_bounds_are_inclusive(quality):
    assert JpegCompressibility(quality=quality).quality == quality


def test_mean_intensity_is_the_mean_pixel_in_unit_range():
    black, white = np.zeros((4, 4, 3), np.uint8), np.full((4, 4, 3), 255, np.uint8)
    half = np.concatenate([black, white], axis=0)
    request = RewardRequest(
        items=[
            RewardItem(id=k, image=v)
            for k, v in {"black": black, "white": white, "half": half}.items()
        ]
    )
    with LocalRewardBackend("mean_intensity") as local:
        assert local.compute_rewards(request).rewards == [0.0, 1.0, 0.5]
        with pytest.raises(ScorerRequestError, match="image"):
            local.compute_rewards(RewardRequest(items=[RewardItem(id="t", text="no image")]))


def test_edit_fidelity_is_the_share_of_the_source_the_edit_kept_and_needs_the_source():
    source = np.zeros((2, 2, 3), np.uint8)
    one_white = source.copy()
    one_white[0, 0] = 255  # a quarter of the pixels changed all the way
    items = [
        RewardItem(id="same", image=source, condition_images=[source]),
        RewardItem(id="quarter", image=one_white, condition_images=[source]),
        RewardItem(
            id="inverted", image=np.full((2, 2, 3), 255, np.uint8), condition_images=[source]
        ),
    ]
    with LocalRewardBackend("edit_fidelity") as local:
        assert local.compute_rewards(RewardRequest(items=items)).rewards == [1.0, 0.75, 0.0]
        with pytest.raises(ScorerRequestError, match="needs the source image in condition_images"):
            local.compute_rewards(RewardRequest(items=[RewardItem(id="alone", image=source)]))
        with pytest.raises(ScorerRequestError, match="not comparable"):
            small = np.zeros((1, 2, 3), np.uint8)
            local.compute_rewards(
                RewardRequest(items=[RewardItem(id="odd", image=small, condition_images=[source])])
            )


def test_video_passes_on_the_inner_scorers_writable_inputs():
    from scorers.builtin.video import VideoScorer

    assert VideoScorer(inner="tests.helpers.fixture_scorers:WritesInputs").spec.writable_inputs
    assert not VideoScorer(inner="mean_intensity").spec.writable_inputs
    clip = np.full((4, 8, 8, 3), 200, np.uint8)
    with LocalRewardBackend(
        "video", params={"inner": "tests.helpers.fixture_scorers:WritesInputs"}
    ) as local:
        assert local.compute_rewards(
            RewardRequest(items=[RewardItem(id="v", video=clip)])
        ).rewards == [0.0]
    assert (clip == 200).all()  # the copies were written, not the trainer's clip
