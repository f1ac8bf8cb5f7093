"""Reward models and functions that fail the way issue 37's items 4 and 11 describe: a call that
hangs on a thread nobody can stop (an FF model, a native model's sync score function), and a native
model whose close() raises after it let go of its weights. Used by tests and by
bench/hardening_terms.py (which also measures an older tree: nothing here needs more than FF's and
the native scorer's public shapes).

torch is imported inside: the test process imports this module without it.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any

from scorers.ff import PointwiseRewardModel, RewardModelOutput


class Hangs(PointwiseRewardModel):
    """Text length per input; a chunk holding an input whose metadata says {"hang": true} blocks its
    worker thread until `release` is set (never, in a child: it is killed with it). `running` counts
    the chunks on the workers now."""

    required_fields = ("prompt", "metadata")
    release = threading.Event()
    lock = threading.Lock()
    running = 0

    def __call__(self, prompt: list[str], metadata: list[str], **kwargs: Any) -> RewardModelOutput:
        cls = type(self)
        with cls.lock:
            cls.running += 1
        try:
            if any(json.loads(meta).get("hang") for meta in metadata):
                cls.release.wait()
            return RewardModelOutput(rewards=[float(len(text)) for text in prompt])
        finally:
            with cls.lock:
                cls.running -= 1


def hanging_score(data_source, solution_image, ground_truth, extra_info, reward_model):  # type: ignore[no-untyped-def]
    """A sync verl-omni score function (on a worker thread): blocks for an hour on an item marked
    {"hang": true}, else the model's first logit."""
    if extra_info.get("hang"):
        time.sleep(3600)
    return float(reward_model.infer(images=[solution_image])[0, 0])


class Tiny:
    """A native model with no weights file: a small linear layer on the images' mean colours."""

    def __init__(self, model_path: str | None, device: Any) -> None:
        import torch

        torch.manual_seed(0)
        self.net = torch.nn.Linear(3, 2).to(device)
        self.ballast = torch.nn.Linear(1000, 1000)  # 4 MB of parameters a sleep must give back

    def infer(self, images: list[Any]) -> Any:
        import torch

        with torch.inference_mode():
            return self.net(
                torch.stack([image.float().mean(dim=(1, 2)) / 255.0 for image in images])
            )


class ClosesBadly(Tiny):
    """Its close() lets go of its weights, then raises."""

    def close(self) -> None:
        del self.net, self.ballast
        raise RuntimeError("close() broke after it released the weights")
