"""OCR text-rendering reward: the string helpers in-process, the scorer in a real child from
envs/ocr."""

from __future__ import annotations

import sys

import numpy as np
import pytest
from PIL import Image, ImageDraw, ImageFont

from scorers.base import ScoreInputError
from scorers.builtin.ocr import (
    OcrScorer,
    levenshtein,
    normalize_ocr_text,
    reading_order,
    similarity,
    target_text,
    to_bgr,
)
from supervisor import RewardItem, RewardRequest, ScorerStartupError
from tests.conftest import env_python

WORDS = ["Apple", "Banana", "Cherry", "Dragon"]


def render(text: str, size: tuple[int, int] = (512, 128)) -> np.ndarray:
    """Black DejaVuSans 48 px on white, vertically centred; a read-only view like decoded wire
    images."""
    image = Image.new("RGB", size, "white")
    font = ImageFont.truetype("DejaVuSans.ttf", 48)
    ImageDraw.Draw(image).text((24, size[1] // 2 - 28), text, fill="black", font=font)
    return np.asarray(image)


def blank() -> np.ndarray:
    return np.full((128, 512, 3), 255, np.uint8)


def request(*pairs: tuple[np.ndarray, object]) -> RewardRequest:
    return RewardRequest(
        items=[RewardItem(id=f"i{n}", image=im, reference=ref) for n, (im, ref) in enumerate(pairs)]
    )


# --- in-process: no rapidocr needed ---------------------------------------------------------------


def test_module_import_does_not_load_rapidocr():
    assert "rapidocr_onnxruntime" not in sys.modules and "onnxruntime" not in sys.modules
    OcrScorer()  # construction is cheap too
    assert "rapidocr_onnxruntime" not in sys.modules


@pytest.mark.parametrize(
    "a,b,distance",
    [
        ("", "", 0),
        ("abc", "", 3),
        ("", "abc", 3),
        ("kitten", "sitting", 3),
        ("flaw", "lawn", 2),
        ("abc", "abc", 0),
        ("abc", "acb", 2),
        ("héllo", "hello", 1),
        ("a" * 50, "b" * 40, 50),
    ],
)
def test_levenshtein(a, b, distance):
    assert levenshtein(a, b) == distance == levenshtein(b, a)


def test_similarity_bounds():
    assert similarity("", "") == 1.0
    assert similarity("abc", "") == 0.0 == similarity("", "x")
    assert similarity("helloworld", "helloworld") == 1.0
    assert similarity("kitten", "sitting") == pytest.approx(1 - 3 / 7)


def test_normaliser():
    assert normalize_ocr_text("  Hello \t World\n") == "helloworld"
    assert normalize_ocr_text("  Hello \t World\n", ignore_spaces=False) == "hello world"
    assert (
        normalize_ocr_text("Hello  World", case_sensitive=True, ignore_spaces=False)
        == "Hello World"
    )
    # NFKC: full-width letters and the ligature fold
    assert normalize_ocr_text("ＨＥＬＬＯ ﬁ") == "hellofi"
    assert normalize_ocr_text("STRASSE") == normalize_ocr_text("straße")  # casefold, not lower


def test_target_text():
    assert target_text("Hi") == "Hi"
    assert target_text({"text": "a", "target": "b", "answer": "c"}) == "a"
    assert target_text({"target": "b", "answer": "c"}) == "b"
    assert target_text({"answer": "c"}) == "c"
    for bad in ({"label": "x"}, 3, None, ["x"], {"text": 5}):
        with pytest.raises(ScoreInputError, match="reference must be a string"):
            target_text(bad)


def box(x: float, y: float, w: float = 80, h: float = 40) -> list[list[float]]:
    return [[x, y], [x + w, y], [x + w, y + h], [x, y + h]]


def test_reading_order_rows_then_columns():
    # "right" sits 8 px higher than "left" but on the same row (within half a line height).
    lines = [(box(20, 200), "bottom"), (box(330, 45, h=54), "right"), (box(20, 53), "left")]
    assert reading_order(lines) == "left right bottom"
    # 30 > 40 / 2: new row
    assert reading_order([(box(0, 0), "top"), (box(300, 30), "lower")]) == "top lower"
    assert reading_order([]) == ""


@pytest.mark.parametrize("channels", [1, 3, 4])
def test_to_bgr_from_read_only_rgb(channels):
    rgb = np.zeros((2, 3, channels), np.uint8)
    rgb[..., 0] = 10
    if channels > 1:
        rgb[..., 1], rgb[..., 2] = 20, 30
    if channels == 4:
        rgb[..., 3] = 255  # opaque
    rgb.flags.writeable = False
    bgr = to_bgr(rgb)
    assert bgr.shape == (2, 3, 3) and bgr.flags.writeable and bgr.flags.c_contiguous
    assert bgr[0, 0].tolist() == ([10, 10, 10] if channels == 1 else [30, 20, 10])
    with pytest.raises(ScoreInputError, match="HWC image"):
        to_bgr(np.zeros((4, 2, 3, 3), np.uint8))


def test_to_bgr_composites_transparent_pixels_over_white():
    rgba = np.zeros((1, 3, 4), np.uint8)  # black everywhere; alpha 255, 128, 0
    rgba[0, :, 3] = [255, 128, 0]
    assert to_bgr(rgba)[0].tolist() == [[0, 0, 0], [127, 127, 127], [255, 255, 255]]


@pytest.mark.parametrize(
    "params,error,needle",
    [
        ({"det_limit_side_len": 736.0}, TypeError, "det_limit_side_len must be an int"),
        ({"det_limit_side_len": 8}, ValueError, "det_limit_side_len must be in"),
        ({"det_limit_type": "sideways"}, ValueError, "det_limit_type must be 'min' or 'max'"),
        ({"use_cls": 1}, TypeError, "use_cls must be a bool"),
        ({"text_score": "0.5"}, TypeError, "text_score must be a number"),
        ({"text_score": 1.5}, ValueError, "text_score must be in"),
        ({"threads": 0}, ValueError, "threads must be >= 1"),
        ({"threads": True}, TypeError, "threads must be an int or None"),
        ({"ignore_spaces": "yes"}, TypeError, "ignore_spaces must be a bool"),
        ({"language": "en"}, TypeError, "language"),
    ],
)
def test_bad_params(params, error, needle):
    with pytest.raises(error, match=needle):
        OcrScorer(**params)


def test_gpu_device_is_refused_before_any_import():
    with pytest.raises(ValueError, match="CPU only; device 'cuda' is not supported"):
        OcrScorer().load("cuda")
    assert "rapidocr_onnxruntime" not in sys.modules


# --- managed: a real child from envs/ocr ----------------------------------------------------------


@pytest.mark.slow
def test_scores_rendered_text_blank_images_and_mapping_references(managed):
    hello = render("Hello World", (640, 160))
    backend = managed(env_python("ocr"), "ocr", input_kind="image")
    assert backend.health()["packages"].keys() == {"rapidocr-onnxruntime", "onnxruntime"}
    response = backend.compute_rewards(
        request(
            (hello, "Hello World"),
            (hello, "Goodbye Moon"),
            (blank(), "anything"),
            (blank(), ""),
            (hello, {"text": "hello world", "answer": "ignored"}),
        )
    )
    good, bad, blank_any, blank_empty, mapped = response.rewards
    assert good >= 0.9 and mapped >= 0.9, response.diagnostics
    assert bad <= 0.5
    assert blank_any == 0.0 and blank_empty == 1.0
    values = response.diagnostics["ocr"]["values"]
    assert values["empty_readings"] == 2 and values["chars_recognised"]["count"] == 5


@pytest.mark.slow
def test_det_limit_side_len_changes_nothing_essential(managed):
    backend = managed(
        env_python("ocr"),
        "ocr",
        input_kind="image",
        params={"det_limit_side_len": 480, "threads": 1},
    )
    response = backend.compute_rewards(request((render("Hello World", (640, 160)), "Hello World")))
    assert response.rewards[0] >= 0.9, response.diagnostics


@pytest.mark.slow
def test_bad_param_is_a_config_failure(managed):
    with pytest.raises(ScorerStartupError) as info:
        managed(env_python("ocr"), "ocr", input_kind="image", params={"det_limit_type": "sideways"})
    assert info.value.returncode == 3 and "det_limit_type must be 'min' or 'max'" in str(info.value)


@pytest.mark.slow
def test_batch_keeps_item_order_across_chunks(managed):
    images = [render(word) for word in WORDS]
    pairs = [(images[i], WORDS[j]) for i in range(4) for j in range(4)]  # image-major 4x4 grid
    backend = managed(
        env_python("ocr"),
        "ocr",
        input_kind="image",
        params={"det_limit_side_len": 480},
        client={"request_batch_size": 5},
    )
    response = backend.compute_rewards(request(*pairs))
    grid = np.array(response.rewards).reshape(4, 4)
    assert grid.argmax(axis=1).tolist() == [0, 1, 2, 3], grid
    assert (np.diag(grid) >= 0.9).all(), response.diagnostics
    report = response.diagnostics["ocr"]  # counts and (sum, count) means add up across the 4 chunks
    assert report["sample_count"] == 16 and report["values"]["chars_recognised"]["count"] == 16
