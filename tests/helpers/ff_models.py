"""FF-style reward models the FF tests run in managed children and in-process (by dotted path).

Each writes what it was called with to `config.journal` (an extra key), one JSON line per call,
so a test sees the chunks, types and nesting the model itself saw, wherever it ran.
"""

from __future__ import annotations

import json
import math
import os
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from scorers.ff import (
    GroupwiseRewardModel,
    PointwiseRewardModel,
    RewardArguments,
    RewardModelOutput,
)


def _journal(config: RewardArguments, entry: dict[str, Any]) -> None:
    journal = config.extra_kwargs.get("journal")
    if journal is not None:
        with Path(journal).open("a") as handle:
            handle.write(json.dumps(entry) + "\n")


class Brightness(PointwiseRewardModel):
    """Mean brightness of the PIL image in [0, 1], plus 0.1 per condition image and metadata's
    `bonus`.

    `metadata` {"nan": true} returns NaN for that input (the contract check must refuse it).
    """

    required_fields = ("prompt", "image", "condition_images", "metadata")
    use_tensor_inputs = False

    def __call__(
        self,
        prompt: list[str],
        image: list[Any],
        condition_images: list[list[Any]],
        metadata: list[str],
        **kwargs: Any,
    ) -> RewardModelOutput:  # noqa: E501
        from PIL import Image

        assert all(isinstance(one, Image.Image) for one in image)
        assert all(
            isinstance(conds, list) and all(isinstance(c, Image.Image) for c in conds)
            for conds in condition_images
        )
        parsed = [json.loads(one) for one in metadata]
        _journal(
            self.config,
            {
                "n": len(prompt),
                "prompts": prompt,
                "conditions": [len(c) for c in condition_images],
                "device": str(self.device),
            },
        )
        rewards = [
            math.nan
            if meta.get("nan")
            else brightness(np.asarray(img)) + 0.1 * len(conds) + float(meta.get("bonus", 0.0))
            for img, conds, meta in zip(image, condition_images, parsed, strict=True)
        ]
        return RewardModelOutput(rewards=rewards)


def brightness(pixels: np.ndarray) -> float:
    return float(pixels.astype(np.float64).mean() / 255.0)


class SharedBrightness(Brightness):
    """Brightness that journals each load (its pid) and, per call, the `config.name` it holds and
    the size of the call: the train/eval sharing test counts loads and chunks."""

    def __init__(self, config: RewardArguments, accelerator: Any) -> None:
        super().__init__(config, accelerator)
        _journal(config, {"load": os.getpid(), "name": config.name})

    def __call__(self, **kwargs: Any) -> RewardModelOutput:
        _journal(self.config, {"call": len(kwargs["prompt"]), "name": self.config.name})
        return super().__call__(**kwargs)


class UnsafeBrightness(Brightness):
    """The same model, declared not thread-safe."""

    thread_safe = False


class SlowBrightness(Brightness):
    """Sleeps in each call and counts how many calls overlap (the async-worker test)."""

    lock = threading.Lock()
    running = 0
    most = 0

    def __call__(self, **kwargs: Any) -> RewardModelOutput:
        cls = type(self)
        with cls.lock:
            cls.running += 1
            cls.most = max(cls.most, cls.running)
        try:
            time.sleep(0.2)
            return super().__call__(**kwargs)
        finally:
            with cls.lock:
                cls.running -= 1


class WrongLength(Brightness):
    def __call__(self, **kwargs: Any) -> RewardModelOutput:
        return RewardModelOutput(rewards=[0.5] * (len(kwargs["prompt"]) + 1))


class AudioModel(PointwiseRewardModel):
    """Seconds of audio per input plus a tenth per channel, from what FF hands over without tensors:
    a private, writable float32 NumPy array (channels, samples) and the rate."""

    required_fields = ("audio", "audio_sample_rate")

    def __call__(
        self, audio: list[Any], audio_sample_rate: list[int], **kwargs: Any
    ) -> RewardModelOutput:
        for wave in audio:
            if not (
                isinstance(wave, np.ndarray)
                and wave.dtype == np.float32
                and wave.ndim == 2
                and wave.flags.writeable
            ):
                raise TypeError(
                    f"audio arrived as {type(wave).__name__} {getattr(wave, 'dtype', '')}"
                )
        return RewardModelOutput(
            rewards=[
                w.shape[1] / rate + 0.1 * w.shape[0]
                for w, rate in zip(audio, audio_sample_rate, strict=True)
            ]
        )


class Unknown(PointwiseRewardModel):
    required_fields = ("prompt", "speech")

    def __call__(self, **kwargs: Any) -> RewardModelOutput:
        return RewardModelOutput(rewards=[])


class GroupRank(GroupwiseRewardModel):
    """Each candidate's brightness rank in its group, scaled to [0, 1], from tensor inputs, plus an
    offset read from `model_path` (a file holding one number) onto the device in the config's
    dtype."""

    required_fields = ("image",)
    use_tensor_inputs = True

    def __init__(self, config: RewardArguments, accelerator: Any) -> None:
        import torch

        super().__init__(config, accelerator)
        self.offset = torch.tensor(float(Path(config.model_path).read_text())).to(
            self.device, self.dtype
        )

    def __call__(self, image: list[Any], **kwargs: Any) -> RewardModelOutput:
        import torch

        assert all(
            isinstance(one, torch.Tensor) and one.dtype == torch.float32 and one.shape[0] == 3
            for one in image
        )
        _journal(self.config, {"n": len(image), "dtype": str(self.dtype)})
        with torch.no_grad():
            means = torch.stack([one.mean() for one in image])
            ranks = means.argsort().argsort().to(torch.float32)
            rewards = ranks / max(1, len(image) - 1) + self.offset.float()
        return RewardModelOutput(rewards=rewards)


def group_images(count: int, seed: int = 5) -> list[np.ndarray]:
    """Deterministic small RGB images of distinct brightness (the same in every env)."""
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 200, (6, 5, 3), dtype=np.uint8) + np.uint8(i * 6) for i in range(count)]


class GroupBrightnessRank(GroupwiseRewardModel):
    """Each candidate's brightness rank in its group, scaled to [0, 1], from PIL images (no torch:
    env `image`); the distributed test ships its groups' images between ranks."""

    required_fields = ("image",)

    def __call__(self, image: list[Any], **kwargs: Any) -> RewardModelOutput:
        _journal(self.config, {"n": len(image), "pid": os.getpid()})
        return RewardModelOutput(rewards=scaled_ranks([brightness(np.asarray(i)) for i in image]))


class GroupVideoRank(GroupwiseRewardModel):
    """The same over each candidate's video (a list of PIL frames): their mean brightness."""

    required_fields = ("video",)

    def __call__(self, video: list[Any], **kwargs: Any) -> RewardModelOutput:
        _journal(self.config, {"n": len(video)})
        means = [float(np.mean([brightness(np.asarray(f)) for f in clip])) for clip in video]
        return RewardModelOutput(rewards=scaled_ranks(means))


def scaled_ranks(values: list[float]) -> list[float]:
    ranks = np.argsort(np.argsort(values, kind="stable"), kind="stable")
    return [float(rank) / max(1, len(values) - 1) for rank in ranks]


def media_groups(count: int, group: int = 4) -> list[Any]:
    """`count` items in groups of `group`, each with an image and a 2-frame video large enough
    (27 KiB, 14 KiB) that a request's arrays take the shared segment; deterministic."""
    from supervisor import RewardItem

    rng = np.random.default_rng(11)
    return [
        RewardItem(
            id=f"m{n}",
            group_id=f"g{n // group}",
            prompt=f"prompt {n // group}",
            image=rng.integers(0, 256, (96, 96, 3), dtype=np.uint8),
            video=rng.integers(0, 256, (2, 48, 48, 3), dtype=np.uint8),
        )
        for n in range(count)
    ]
