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
from scorers.ff.registry import (
    register_reward_model,
    registered_reward_models,
    reward_model_path,
    unregister_reward_model,
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
    "register_reward_model",
    "registered_reward_models",
    "reward_model_path",
    "unregister_reward_model",
]
