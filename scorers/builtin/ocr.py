"""Text-rendering reward for text-to-image RL: 1 - normalised edit distance between OCR'd and target
text."""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from scorers.base import ScoreInputError, ScoreItem, Scorer, ScoreResult, ScorerSpec
from scorers.diagnostics import mean

_SPACE = re.compile(r"\s+")
_TARGET_KEYS = ("text", "target", "answer")


def normalize_ocr_text(text: str, case_sensitive: bool = False, ignore_spaces: bool = True) -> str:
    """NFKC (full-width and ligatures fold), casefold, and drop or collapse whitespace, so layout is
    not scored."""
    text = unicodedata.normalize("NFKC", text)
    if not case_sensitive:
        text = text.casefold()
    return _SPACE.sub("", text) if ignore_spaces else _SPACE.sub(" ", text).strip()


def levenshtein(a: str, b: str) -> int:
    """Edit distance (insert, delete, substitute all cost 1); two rows, no dependency for short
    strings."""
    if len(a) < len(b):
        a, b = b, a
    previous = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        current = [i]
        for j, cb in enumerate(b, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ca != cb)))
        previous = current
    return previous[-1]


def similarity(pred: str, target: str) -> float:
    """1 - distance / longer length; two empty strings agree fully."""
    longest = max(len(pred), len(target))
    return 1.0 if longest == 0 else 1.0 - levenshtein(pred, target) / longest


def target_text(reference: Any) -> str:
    """The text the image should show: a string, or a mapping with 'text' (preferred), 'target' or
    'answer'."""
    if isinstance(reference, Mapping):
        for key in _TARGET_KEYS:
            if key in reference:
                return target_text(reference[key])
    elif isinstance(reference, str):
        return reference
    raise ScoreInputError(
        f"reference must be a string or an object with one of {list(_TARGET_KEYS)}"
    )


def reading_order(lines: Sequence[tuple[Sequence[Sequence[float]], str]]) -> str:
    """Join detected lines top-to-bottom, then left-to-right; boxes within half a line height share
    a row."""
    boxes = sorted(
        (
            (
                min(p[1] for p in box),
                min(p[0] for p in box),
                max(p[1] for p in box) - min(p[1] for p in box),
                text,
            )
            for box, text in lines
        )
    )
    rows: list[list[tuple[float, float, float, str]]] = []
    for box in boxes:
        if rows and box[0] - rows[-1][0][0] <= 0.5 * rows[-1][0][2]:
            rows[-1].append(box)
        else:
            rows.append([box])
    return " ".join(
        text for row in rows for _, _, _, text in sorted(row, key=lambda b: b[1]) if text
    )


def to_bgr(image: np.ndarray) -> np.ndarray:
    """RapidOCR takes an ndarray as opencv BGR as-is (and mangles RGBA), so convert here.

    Gray is expanded; RGBA is composited over white (dropping alpha would turn black
    text on a transparent background into an all-black image).
    """
    if not isinstance(image, np.ndarray) or image.ndim != 3 or image.shape[2] not in (1, 3, 4):
        raise ScoreInputError(
            f"expected an HWC image with 1, 3 or 4 channels, got {getattr(image, 'shape', image)!r}"
        )
    if image.shape[2] == 1:
        return np.ascontiguousarray(np.repeat(image, 3, axis=2))
    if image.shape[2] == 4:
        alpha = image[:, :, 3:4].astype(np.float32) / 255.0
        image = (image[:, :, :3] * alpha + 255.0 * (1.0 - alpha)).round().astype(np.uint8)
    return np.ascontiguousarray(image[:, :, 2::-1])  # RGB -> BGR, a fresh writable copy


class OcrScorer(Scorer):
    """RapidOCR (PP-OCRv4 ONNX on CPU) reads the image; the score is how close its text is to the
    target."""

    spec = ScorerSpec(
        name="ocr",
        input_kind="image",
        required_fields=("image", "reference"),
        terms=("ocr",),
        revision="rapidocr-onnxruntime-1.4.4",
        env="ocr",
        supports_offload=False,
        report_packages=("rapidocr-onnxruntime", "onnxruntime"),
        diagnostics=("chars_recognised", "empty_readings"),
        requires_modules=("rapidocr_onnxruntime", "onnxruntime"),
    )

    def __init__(
        self,
        det_limit_side_len: int = 736,
        det_limit_type: str = "min",
        use_cls: bool = False,
        text_score: float = 0.5,
        threads: int | None = None,
        case_sensitive: bool = False,
        ignore_spaces: bool = True,
    ) -> None:
        if isinstance(det_limit_side_len, bool) or not isinstance(det_limit_side_len, int):
            raise TypeError(f"det_limit_side_len must be an int, got {det_limit_side_len!r}")
        if not 32 <= det_limit_side_len <= 4096:
            raise ValueError(f"det_limit_side_len must be in [32, 4096], got {det_limit_side_len}")
        if det_limit_type not in ("min", "max"):
            raise ValueError(f"det_limit_type must be 'min' or 'max', got {det_limit_type!r}")
        for name, flag in (
            ("use_cls", use_cls),
            ("case_sensitive", case_sensitive),
            ("ignore_spaces", ignore_spaces),
        ):
            if not isinstance(flag, bool):
                raise TypeError(f"{name} must be a bool, got {flag!r}")
        if isinstance(text_score, bool) or not isinstance(text_score, (int, float)):
            raise TypeError(f"text_score must be a number, got {text_score!r}")
        if not 0.0 <= text_score <= 1.0:
            raise ValueError(f"text_score must be in [0, 1], got {text_score}")
        if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int)):
            raise TypeError(f"threads must be an int or None, got {threads!r}")
        if threads is not None and threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        self.det_limit_side_len, self.det_limit_type = det_limit_side_len, det_limit_type
        self.use_cls, self.text_score, self.threads = use_cls, float(text_score), threads
        self.case_sensitive, self.ignore_spaces = case_sensitive, ignore_spaces
        self._engine: Any = None

    def load(self, device: str = "cpu") -> None:
        if device != "cpu":
            raise ValueError(
                f"scorer 'ocr' runs onnxruntime on CPU only; device {device!r} is not supported"
            )
        from rapidocr_onnxruntime import RapidOCR

        # RapidOCR ignores a thread count outside [1, cpu_count] (-1: onnxruntime's default), and
        # with det_limit_type="max" it ignores det_limit_side_len (960/1500/2000 by image size).
        self._engine = RapidOCR(
            det_limit_side_len=self.det_limit_side_len,
            det_limit_type=self.det_limit_type,
            text_score=self.text_score,
            intra_op_num_threads=self.threads or -1,
        )

    def recognise(self, image: np.ndarray) -> str:
        """The image's text in reading order; '' when nothing is detected."""
        if self._engine is None:
            raise RuntimeError("OcrScorer.load() was not called")
        # No other kwargs: any kwarg to __call__ resets text_score/box_thresh to RapidOCR's
        # defaults.
        result, _ = self._engine(to_bgr(image), use_cls=self.use_cls)
        return reading_order([(line[0], line[1]) for line in result or []])

    def score(self, items: Sequence[ScoreItem]) -> ScoreResult:
        # refuse bad references before any OCR
        targets = [target_text(item.reference) for item in items]
        texts = [self.recognise(item.required_image()) for item in items]
        norm = lambda s: normalize_ocr_text(s, self.case_sensitive, self.ignore_spaces)  # noqa: E731
        scores = [
            similarity(norm(text), norm(target))
            for text, target in zip(texts, targets, strict=True)
        ]
        return ScoreResult(
            terms={"ocr": scores},
            diagnostics={
                "chars_recognised": mean(sum(len(text) for text in texts), len(texts)),
                "empty_readings": sum(1 for text in texts if not text),
            },
        )

    def close(self) -> None:
        self._engine = None
