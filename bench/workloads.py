"""Deterministic bench inputs, built the same way in the trainer env and in scorer envs.

Stdlib + numpy at import; PIL only inside the OCR workload (the embed env has no PIL).
"""

from __future__ import annotations

from typing import Any

import numpy as np

WORDS = ["reward", "scorer", "gradient", "policy", "rollout", "advantage", "sample", "batch"]


def ocr_items(n: int = 4) -> list[dict[str, Any]]:
    """n 512x128 images with a rendered word each, and that word as the target."""
    from PIL import Image, ImageDraw, ImageFont

    font = ImageFont.truetype("DejaVuSans.ttf", 48)
    items = []
    for i in range(n):
        word = f"{WORDS[i % len(WORDS)]} {i}"
        image = Image.new("RGB", (512, 128), "white")
        ImageDraw.Draw(image).text((20, 30), word, fill="black", font=font)
        items.append({"id": f"ocr{i}", "image": np.asarray(image), "reference": word})
    return items


def embed_items(n: int = 64) -> list[dict[str, Any]]:
    """n completion/reference sentence pairs."""
    return [
        {
            "id": f"t{i}",
            "text": f"The {WORDS[i % 8]} number {i} improves the {WORDS[(i + 3) % 8]}.",
            "reference": f"Sentence {i} says the {WORDS[i % 8]} helps the {WORDS[(i + 3) % 8]}.",
        }
        for i in range(n)
    ]


def image_items(n: int = 8, size: int = 512) -> list[dict[str, Any]]:
    rng = np.random.default_rng(0)
    return [{"id": f"img{i}", "image": rng.integers(0, 256, (size, size, 3), dtype=np.uint8)} for i in range(n)]


def math_items(n: int = 64) -> list[dict[str, Any]]:
    """n distinct completions with gold answers (the math throughput bench's mix)."""
    from bench.math_throughput import workload

    return [{"id": f"m{i}", "text": text, "reference": gold} for i, (text, gold) in enumerate(workload(1000, n))]


WORKLOADS = {"ocr": ocr_items, "embed": embed_items, "image": image_items, "math": math_items}
