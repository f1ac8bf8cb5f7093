"""Deterministic bench inputs, built the same way in the trainer env and in scorer envs.

Stdlib + numpy at import; PIL only inside the OCR workload (the embed env has no PIL).
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, Any

import numpy as np

from bench.common import workload

if TYPE_CHECKING:
    from supervisor import RewardRequest

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
    return [
        {"id": f"img{i}", "image": rng.integers(0, 256, (size, size, 3), dtype=np.uint8)}
        for i in range(n)
    ]


def math_items(n: int = 64) -> list[dict[str, Any]]:
    """n distinct completions with gold answers (the math throughput bench's mix)."""
    return [
        {"id": f"m{i}", "text": text, "reference": gold}
        for i, (text, gold) in enumerate(workload(1000, n))
    ]


WORKLOADS = {"ocr": ocr_items, "embed": embed_items, "image": image_items, "math": math_items}


def image_request() -> RewardRequest:
    from supervisor import RewardItem, RewardRequest

    return RewardRequest(items=[RewardItem(**raw) for raw in WORKLOADS["image"]()])


def grpo_request(n: int = 128, group: int = 8) -> RewardRequest:
    """n math completions in GRPO groups of `group`, one gold answer per group (the panel lines'
    step)."""
    from supervisor import RewardItem, RewardRequest

    raw = math_items(n)
    items = [
        RewardItem(
            id=r["id"],
            group_id=f"q{i // group}",
            prompt=f"question {i // group}",
            text=r["text"],
            reference=raw[(i // group) * group]["reference"],  # one gold answer per group
        )
        for i, r in enumerate(raw)
    ]
    return RewardRequest(items=items, group_size=group)


# math_verify under hostile completions (bench.hostile_math, bench.hardening_calls)
FIRST_ITEM = 10_000  # slices of the workload from here on: every number in them has 5 digits
PATHOLOGICAL = (
    "\\boxed{9^{9^{9^{9}}}}",
    "\\boxed{(10^{9})!}",
    "\\boxed{(x+1)^{100000}}",
    "\\boxed{10^{10^{10}}}",
    "\\boxed{8^{8^{8^{8}}}}",
    "\\boxed{(10^{8})!}",
    "\\boxed{(x+2)^{100000}}",
    "\\boxed{2^{2^{36}}}",
)


def slices(ordinary: int = 512):
    """Fresh slices of ordinary tasks, `ordinary` items each, never seen by a worker."""
    start = FIRST_ITEM
    while True:
        yield [(text, gold, 6, 15, True) for text, gold in workload(start, ordinary)]
        start += ordinary


def with_hazards(
    ordinary: list[tuple], hazards: int = len(PATHOLOGICAL)
) -> tuple[list[tuple], list[int]]:
    """The ordinary tasks with the first `hazards` pathological ones spread through them (fixed
    seed), and where the ordinary ones sit."""
    size = len(ordinary) + hazards
    spots = set(random.Random(0).sample(range(size), hazards))
    tasks, pathological, rest = [], iter(PATHOLOGICAL[:hazards]), iter(ordinary)
    for position in range(size):
        tasks.append((next(pathological), "1", 6, 15, True) if position in spots else next(rest))
    return tasks, [i for i in range(len(tasks)) if i not in spots]
