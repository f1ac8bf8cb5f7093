"""What an FF-style reward model imports: its base classes, its output, its config, and what
stands in for FF's `accelerate.Accelerator`. Stdlib only (torch when present, never required), so a
model without torch (a PIL statistic) runs in an env without torch.

An FF model ports by one import: `from scorers.ff import PointwiseRewardModel, RewardModelOutput`
(and `RewardArguments`, `Accelerator` if it names them) instead of FF's `.abc` and `..hparams`.
`scorers.ff.scorer.FfModelScorer` runs such a class as this project's `Scorer`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from scorers.base import ScorerContractError

# FF's dtype names; a torch.dtype when torch is importable in the model's env, else the name
DTYPES = {
    "fp16": "float16",
    "bf16": "bfloat16",
    "fp32": "float32",
    "float16": "float16",
    "bfloat16": "bfloat16",
    "float32": "float32",
}


class RewardModelError(ScorerContractError):
    """A reward model broke FF's output contract (not one finite score per input, in order)."""


class RewardModelTimeout(RuntimeError):
    """A reward model's call did not return within the scorer's `call_timeout_s`."""


class RewardModelConfigError(ValueError):
    """A reward model's declaration or configuration cannot be honoured (refused at
    construction)."""


@dataclass
class RewardModelOutput:
    """One reward per input, in order: a list, a NumPy array or a 1-D tensor. `extra_info` is the
    model's own; it is not reported (diagnostics here are declared names only)."""

    rewards: Any
    extra_info: dict[str, Any] | None = None


def _torch() -> Any:
    """torch if the env has it (device and dtype become torch objects), else None."""
    try:
        import torch
    except ImportError:
        return None
    return torch


@dataclass
class RewardArguments:
    """FF's per-reward config: the keys it names, the rest in `extra_kwargs` (also read as
    attributes, `config.threshold`). `device` and `dtype` are torch objects where torch is
    importable."""

    name: str = "default"
    reward_model: str | None = None
    model_path: str | None = None
    dtype: Any = "bfloat16"
    device: Any = "cpu"
    batch_size: int = 16
    weight: Any = 1.0
    async_reward: bool = False
    num_workers: int = 1
    extra_kwargs: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        torch = _torch()
        if isinstance(self.dtype, str):
            if self.dtype not in DTYPES:
                raise RewardModelConfigError(
                    f"reward {self.name!r}: dtype {self.dtype!r} is not one of {sorted(DTYPES)}"
                )
            self.dtype = (
                getattr(torch, DTYPES[self.dtype]) if torch is not None else DTYPES[self.dtype]
            )
        if isinstance(self.device, str) and torch is not None:
            self.device = torch.device(self.device)

    def __getattr__(self, key: str) -> Any:
        extra = self.__dict__.get("extra_kwargs", {})
        if key in extra:
            return extra[key]
        raise AttributeError(f"RewardArguments has no {key!r} (extra keys: {sorted(extra)})")


@dataclass(frozen=True)
class LocalAccelerator:
    """The stand-in for FF's Accelerator: the child is one rank's own full replica, so it is process
    0 of 1 on `device`. It has no `prepare`: FF forbids a reward model to prepare or shard
    itself."""

    device: Any
    process_index: int = 0
    num_processes: int = 1
    is_main_process: bool = True
    is_local_main_process: bool = True


Accelerator = LocalAccelerator  # the name FF's model signatures annotate with


class BaseRewardModel:
    """FF's base: `__init__(config, accelerator)` keeps both and sets `device`, `dtype`, `model`.

    Class attributes: `required_fields` (the only fields passed, as keyword lists),
    `use_tensor_inputs` (False: PIL; True: float tensors in [0, 1]) and, ours, `thread_safe` (False
    refuses num_workers > 1).
    """

    required_fields: ClassVar[tuple[str, ...]] = ("image", "prompt")
    use_tensor_inputs: ClassVar[bool] = False
    thread_safe: ClassVar[bool] = True
    groupwise: ClassVar[bool] = False

    def __init__(self, config: RewardArguments, accelerator: LocalAccelerator | None) -> None:
        self.config = config
        self.accelerator = accelerator
        self.device = accelerator.device if accelerator is not None else config.device
        self.dtype = config.dtype
        self.model: Any = None

    def __call__(self, **kwargs: Any) -> RewardModelOutput:
        raise NotImplementedError(f"{type(self).__name__} must implement __call__")

    def to(self, device: Any) -> BaseRewardModel:
        """Move the model (if it has a `model` with `.to`) and remember the device, as FF does."""
        if self.model is not None and hasattr(self.model, "to"):
            self.model.to(device)
        self.device = device
        return self


class PointwiseRewardModel(BaseRewardModel):
    """Scores each input alone: a call gets a chunk of at most `config.batch_size` inputs."""


class GroupwiseRewardModel(BaseRewardModel):
    """Scores one complete group per call (its members share a `group_id`); `batch_size` does not
    apply."""

    groupwise: ClassVar[bool] = True
