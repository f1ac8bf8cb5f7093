"""`make demo`: score the bundled samples through managed children and print what happened.

Shows the reason the project exists: the trainer env (hydra-core 1.3.2, antlr 4.9.3)
grades `10\\%` against 0.1 wrong in-process; the math child (antlr 4.13.2) grades it right.
"""

from __future__ import annotations

import importlib.metadata
import json
import time
from pathlib import Path

import numpy as np

from supervisor.backends.local import LocalRewardBackend
from supervisor.backends.managed import ManagedScorerProcessBackend
from supervisor.compose.recipes import build_panels, load_recipe
from supervisor.ops.preflight import preflight
from supervisor.types import RewardItem, RewardRequest

SAMPLES = Path(__file__).with_name("demo_samples.json")
MATH_TIMEOUT_S = 3.0


def make_image(kind: str, size: int = 256) -> np.ndarray:
    rng = np.random.default_rng(0)
    if kind == "flat":
        return np.full((size, size, 3), 128, np.uint8)
    if kind == "gradient":
        ramp = np.linspace(0, 255, size, dtype=np.float64)
        return np.stack([np.add.outer(ramp, ramp) / 2] * 3, axis=-1).astype(np.uint8)
    if kind == "checker":
        tile = (np.indices((size, size)).sum(axis=0) // 16 % 2 * 255).astype(np.uint8)
        return np.repeat(tile[:, :, None], 3, axis=2)
    return rng.integers(0, 256, (size, size, 3), dtype=np.uint8)


def render_text(text: str) -> np.ndarray:
    """Black DejaVu Sans on white: what a text-rendering reward would see."""
    from PIL import Image, ImageDraw, ImageFont

    image = Image.new("RGB", (512, 128), "white")
    ImageDraw.Draw(image).text((20, 30), text, fill="black", font=ImageFont.truetype("DejaVuSans.ttf", 48))
    return np.asarray(image)


def run_managed(scorer: str, env: str, kind: str, params: dict, request: RewardRequest) -> tuple[list[float], dict]:
    spec = {
        "env": env,  # a scorer env by name: built by `make envs` or `managed-scorers envs build`
        "scorer": {"name": scorer, "input_kind": kind, "params": params},
        "client": {"input_kind": kind},
    }
    backend = ManagedScorerProcessBackend(spec)
    try:
        packages = backend.health()["packages"]
        started = time.monotonic()
        response = backend.compute_rewards(request)
        score_s = time.monotonic() - started
        shared = backend.ready_info.get("shared_memory")
    finally:
        backend.close()
    timings = {
        "spawn_to_ready_s": backend.timings["spawn_to_ready_s"],
        "score_s": score_s,
        "shared_memory": shared,
        "shutdown_s": backend.timings["shutdown_s"],
        "packages": packages,
        "pid": backend.pid,
        "diagnostics": response.diagnostics,
    }
    return response.rewards, timings


def grpo_panel(samples: dict) -> None:
    """A GRPO step's rewards from a verl-omni-style recipe: groups of 4, a required math term in
    its child, an optional comparative judge in-process, applicability by dataset."""
    recipe = {
        "reward": {
            "group_size": 4,
            "models": {
                "math": {"backend": "managed", "scorer": "math_verify", "env": "math",
                         "params": {"timeout_s": MATH_TIMEOUT_S}},
                "judge": {"backend": "local", "scorer": "pairwise_judge", "params": {"inner": "token_f1"}},
            },
            "reward_functions": {
                "correct": {"model": "math", "weight": 1.0},
                "rank": {"model": "judge", "weight": 0.25, "required": False, "applicable_datasets": ["gsm8k"]},
            },
        }
    }  # fmt: skip
    preflight(recipe)  # names every problem before anything starts
    train, _ = build_panels(load_recipe(recipe))
    items = [RewardItem(**s, id=f"r{k}") for k, s in enumerate(samples["grpo"])]
    with train:
        response = train.compute_rewards(RewardRequest(items=items))
    print("\nGRPO panel: final = 1.0 * correct + 0.25 * rank (rank: gsm8k only, optional)")
    print(f"  {'id':<5} {'group':<6} {'completion':<26} {'correct':>7} {'rank':>6} {'final':>6}")
    for i, item in enumerate(items):
        rank = response.component_rewards["rank"][i]
        print(
            f"  {item.id:<5} {item.group_id:<6} {item.text!r:<26} {response.component_rewards['correct'][i]:>7.1f} "
            f"{'-' if rank is None else f'{rank:.2f}':>6} {response.rewards[i]:>6.2f}"
        )
    print(f"  metrics: {response.metrics()}")


def main() -> None:
    samples = json.loads(SAMPLES.read_text())
    math_info = math_versus_in_process(samples)
    image_info = jpeg_images(samples)
    ocr_info = ocr_renders(samples)
    text_info = text_similarities(samples)
    grpo_panel(samples)
    print("\nlifecycle (seconds)")
    print(f"  {'child':<24} {'spawn->ready':>12} {'score':>8} {'shutdown':>9}  shared-memory data plane")
    for name, info in (
        ("math_verify (math)", math_info),
        ("jpeg (image)", image_info),
        ("ocr (ocr)", ocr_info),
        ("text_similarity (embed)", text_info),
    ):
        print(
            f"  {name:<24} {info['spawn_to_ready_s']:>12.3f} {info['score_s']:>8.3f} {info['shutdown_s']:>9.3f}  "
            f"{'negotiated' if info['shared_memory'] else 'in-band'}"
        )


def math_versus_in_process(samples: dict) -> dict:
    """The math samples graded in the trainer env and in the math child, side by side; the child's info."""
    math_request = RewardRequest(items=[RewardItem(**s) for s in samples["math"]])
    params = {"timeout_s": MATH_TIMEOUT_S}
    managed_math, math_info = run_managed("math_verify", "math", "text", params, math_request)
    with LocalRewardBackend("math_verify", params=params) as local:
        local_math = local.compute_rewards(math_request).rewards

    print("math_verify: trainer env (in-process) vs managed child (envs/math)")
    print(
        f"  antlr4-python3-runtime: trainer {importlib.metadata.version('antlr4-python3-runtime')}, "
        f"child {math_info['packages'].get('antlr4-python3-runtime')}"
    )
    print(f"  {'id':<8} {'completion':<34} {'gold':<5} {'in-process':>10} {'managed':>8}")
    for item, here, there in zip(math_request.items, local_math, managed_math, strict=True):
        flag = "  <- wrong in-process" if here != there else ""
        print(f"  {item.id:<8} {item.text:<34} {item.reference:<5} {here:>10.1f} {there:>8.1f}{flag}")
    timeouts = math_info["diagnostics"]["math_verify"]["values"]["timeouts"]
    print(f"  timeouts: {timeouts} (per-item timeout {MATH_TIMEOUT_S} s)")
    return math_info


def jpeg_images(samples: dict) -> dict:
    image_request = RewardRequest(
        items=[RewardItem(id=s["id"], image=make_image(s["kind"])) for s in samples["images"]]
    )
    jpeg, image_info = run_managed("jpeg_compressibility", "image", "image", {}, image_request)
    print("\njpeg_compressibility (minus JPEG q95 kB) in a managed child (envs/image)")
    for item, value in zip(image_request.items, jpeg, strict=True):
        print(f"  {item.id:<10} {value:>9.3f}")
    return image_info


def ocr_renders(samples: dict) -> dict:
    ocr_request = RewardRequest(
        items=[RewardItem(id=s["id"], image=render_text(s["render"]), reference=s["target"]) for s in samples["ocr"]]
    )
    ocr, ocr_info = run_managed("ocr", "ocr", "image", {"det_limit_side_len": 480}, ocr_request)
    print("\nocr (1 - normalized edit distance to the target) in a managed child (envs/ocr)")
    for item, value in zip(ocr_request.items, ocr, strict=True):
        print(f"  {item.id:<10} target {item.reference!r:<18} {value:>6.3f}")
    return ocr_info


def text_similarities(samples: dict) -> dict:
    text_request = RewardRequest(items=[RewardItem(**s) for s in samples["text"]])
    similarity, text_info = run_managed("text_similarity", "embed", "text", {}, text_request)
    print("\ntext_similarity (MiniLM cosine) in a managed child (envs/embed, torch)")
    for item, value in zip(text_request.items, similarity, strict=True):
        print(f"  {item.id:<11} {item.text!r:<44} vs {item.reference!r:<30} {value:>6.3f}")
    return text_info


if __name__ == "__main__":
    main()
