"""DDPO / flow-GRPO style: the JPEG-compressibility reward of generated images, from a managed child.

    python examples/ddpo_jpeg.py    # the image env by name (make env-image); --image-python PATH for another

A stand-in pipeline "samples" float NCHW images in [0, 1], what a VAE decode with
`output_type="pt"` hands over (torch CPU tensors work the same). As flow_grpo's training loop
does, each sampling batch's reward is submitted to a thread pool while the next batch is
sampled, and all are collected at the end. Smooth images compress well (high reward), noise
does not. `--report FILE` writes the images' seeds and rewards, for tests/trainers/test_examples.py.
"""  # noqa: E501 (its first line is the --help description, the second a command to copy)

from __future__ import annotations

import argparse
import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from supervisor import ManagedScorerProcessBackend
from supervisor.adapters.ddpo import DDPORewardFn


def sample(seed: int, batch: int, size: int = 64) -> np.ndarray:
    """`batch` images, float32 NCHW in [0, 1]: a smooth gradient plus noise that grows along the
    batch."""
    rng = np.random.default_rng(seed)
    ramp = np.linspace(0.0, 1.0, size, dtype=np.float32)
    smooth = np.broadcast_to(ramp[None, None, :], (3, size, size))
    noise_levels = np.linspace(0.0, 0.5, batch, dtype=np.float32)
    noise = rng.random((batch, 3, size, size), dtype=np.float32) - 0.5
    return np.clip(smooth[None] + noise_levels[:, None, None, None] * noise, 0.0, 1.0)


def run(image_python: str | None, batches: int, batch: int) -> dict[str, list]:
    where: dict = (
        {"process": {"python_executable": image_python}} if image_python else {"env": "image"}
    )
    backend = ManagedScorerProcessBackend(
        {
            **where,
            "scorer": {"name": "jpeg_compressibility", "input_kind": "image"},
            "client": {"input_kind": "image"},
        }
    )
    with backend, ThreadPoolExecutor(max_workers=2) as executor:
        reward_fn = DDPORewardFn(backend, output_range="zero_one")
        pending = []
        for seed in range(batches):  # sample, hand the reward to the pool, keep sampling
            images = sample(seed, batch)
            prompts = [f"a gradient, noise level {k}" for k in range(batch)]
            pending.append(executor.submit(reward_fn, images, prompts, [{} for _ in prompts]))
        results = [future.result(timeout=120) for future in pending]
    return {"seeds": list(range(batches)), "rewards": [rewards.tolist() for rewards, _ in results]}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--image-python", help="python of the image scorer env (default: the built `image` env)"
    )
    parser.add_argument("--batches", type=int, default=3)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--report", type=Path)
    args = parser.parse_args(argv)
    report = run(args.image_python, args.batches, args.batch)
    for seed, rewards in zip(report["seeds"], report["rewards"], strict=True):
        print(
            f"batch {seed}: " + "  ".join(f"{r:7.2f}" for r in rewards) + "  (-kB, smooth to noisy)"
        )
    if args.report:
        args.report.write_text(json.dumps(report))


if __name__ == "__main__":
    main()
