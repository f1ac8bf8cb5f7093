"""A user's own model-backed UniRL scorer: a subclass of UniRL 0.2.0's `LocalRewardBackend` with its
Spec, as a UniRL user writes one. The model is a tiny seeded torch module saved to a checkpoint
(`build`), loaded in `_load_model` onto UniRL's resolved device: prompt words (hashed into an
embedding table) against the mean colour of the image, squashed by tanh. A prompt of "nan" scores
NaN (a broken model's output), to show a non-finite reward is an item failure, never a value.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import torch
from unirl.reward.base import PromptRewardComponentSpec
from unirl.reward.local.base import LocalRewardBackend
from unirl.reward.local.device import resolve_device
from unirl.types.reward import RewardRequest

BUCKETS = 64


class TinyAlign(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.words = torch.nn.Embedding(BUCKETS, 3)
        self.scale = torch.nn.Linear(3, 1)

    def forward(self, word_ids: torch.Tensor, colour: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.scale(self.words(word_ids).mean(0) * colour)).squeeze(-1)


def build(path: str) -> None:
    torch.manual_seed(0)
    torch.save(TinyAlign().state_dict(), path)


class TinyAlignScorer(LocalRewardBackend):
    """Prompt-image alignment from a tiny checkpoint (`config.model_path`)."""

    canonical_model_name = "tiny_align"
    input_kind = "image"

    def __init__(self, *, config: TinyAlignSpec, base_device: str) -> None:
        self._path, self._log = config.model_path, config.residency_log
        super().__init__(
            device=resolve_device(config.device, base_device),
            batch_size=config.batch_size,
            prompt_source=config.prompt_source,
        )

    def _load_model(self) -> None:
        model = TinyAlign()
        model.load_state_dict(torch.load(self._path, weights_only=True))
        self.model = model.to(self.device).eval()

    def offload(self) -> None:
        super().offload()
        self._said("offload")

    def onload(self) -> None:
        super().onload()
        self._said("onload")

    def _said(self, what: str) -> None:
        """Each residency move, in order, for the test to read (on a CPU both are no-ops)."""
        if self._log:
            with open(self._log, "a") as log:
                log.write(what + "\n")

    def _compute_model_rewards(self, request: RewardRequest) -> list[float]:
        rewards = []
        pixels = [image.pixels for image in request.generated["image"].to_list()]
        for prompt, image in zip(self.prompts(request), pixels, strict=True):
            if prompt == "nan":
                rewards.append(float("nan"))
                continue
            ids = torch.tensor([zlib.crc32(w.encode()) % BUCKETS for w in prompt.split()])
            with torch.no_grad():
                colour = image.to(self.device).mean(dim=(1, 2))
                rewards.append(float(self.model(ids.to(self.device), colour)))
        return rewards


@dataclass
class TinyAlignSpec(PromptRewardComponentSpec):
    model_path: str = ""
    residency_log: str = ""
    batch_size: int = 8
    device: str = "auto"
