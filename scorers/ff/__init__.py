"""FF-style reward models (`scorers.ff.models`) and the scorer that runs them (`scorers.ff.scorer`).

A model author imports from here; this package imports without torch.
"""

from scorers.ff.models import (
    Accelerator,
    BaseRewardModel,
    GroupwiseRewardModel,
    LocalAccelerator,
    PointwiseRewardModel,
    RewardArguments,
    RewardModelConfigError,
    RewardModelError,
    RewardModelOutput,
    RewardModelTimeout,
)

__all__ = [
    "Accelerator",
    "BaseRewardModel",
    "GroupwiseRewardModel",
    "LocalAccelerator",
    "PointwiseRewardModel",
    "RewardArguments",
    "RewardModelConfigError",
    "RewardModelError",
    "RewardModelOutput",
    "RewardModelTimeout",
]
