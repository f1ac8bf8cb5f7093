"""DDPO's JPEG rewards: compressibility (-kB) and incompressibility (+kB) at a fixed quality."""

from __future__ import annotations

import io
from collections.abc import Sequence

import numpy as np

from scorers.base import ScoreInputError, ScoreItem, Scorer, ScoreResult, ScorerSpec


def jpeg_size_kb(image: np.ndarray, quality: int) -> float:
    """Size in kB (1000 bytes) of the image saved as JPEG at `quality`."""
    from PIL import Image

    if image.ndim != 3:
        raise ScoreInputError(f"expected an HWC image, got shape {list(image.shape)}")
    channels = image.shape[2]
    pil = Image.fromarray(image[:, :, 0] if channels == 1 else image[:, :, :3])
    buffer = io.BytesIO()
    pil.save(buffer, format="JPEG", quality=quality)
    return buffer.tell() / 1000.0


class _JpegSize(Scorer):
    sign = 1.0

    def __init__(self, quality: int = 95) -> None:
        if isinstance(quality, bool) or not isinstance(quality, int) or not 1 <= quality <= 100:
            raise ValueError(f"quality must be an int in [1, 100], got {quality!r}")
        self.quality = quality

    def load(self, device: str = "cpu") -> None:
        import PIL.Image  # noqa: F401 - import once here, not on the first batch

    def score(self, items: Sequence[ScoreItem]) -> ScoreResult:
        name = self.spec.name
        return ScoreResult(
            terms={
                name: [
                    self.sign * jpeg_size_kb(item.required_image(), self.quality) for item in items
                ]
            }
        )


class JpegCompressibility(_JpegSize):
    """Minus the JPEG size: rewards images that compress well."""

    spec = ScorerSpec(
        name="jpeg_compressibility",
        input_kind="image",
        required_fields=("image",),
        terms=("jpeg_compressibility",),
        revision="ddpo-q95",
        env="image",
        requires_modules=("PIL",),
    )
    sign = -1.0


class JpegIncompressibility(_JpegSize):
    """Plus the JPEG size: rewards detail that does not compress."""

    spec = ScorerSpec(
        name="jpeg_incompressibility",
        input_kind="image",
        required_fields=("image",),
        terms=("jpeg_incompressibility",),
        revision="ddpo-q95",
        env="image",
        requires_modules=("PIL",),
    )
