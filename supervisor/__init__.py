"""Trainer side of managed-scorers: one RewardBackend interface over in-process,
managed-child and remote scorers.

Note: `supervisor` is also supervisord's import name; never install both in one env.
"""

from supervisor.backend import RewardBackend
from supervisor.config import (
    ClientConfig,
    LimitsConfig,
    ManagedScorerProcessSpec,
    ProcessConfig,
    RestartPolicy,
    ScorerConfig,
)
from supervisor.errors import (
    BackendNotOwned,
    ChildRecord,
    ConfigError,
    RewardContractError,
    ScorerCrashLoop,
    ScorerError,
    ScorerProcessDied,
    ScorerRequestError,
    ScorerStartupError,
    ScorerTimeout,
    ScorerUnavailable,
)
from supervisor.local import LocalRewardBackend
from supervisor.managed import ManagedScorerProcessBackend
from supervisor.remote import RemoteRewardBackend
from supervisor.service import PrecomputedRewardError, RewardService
from supervisor.types import RewardItem, RewardRequest, RewardResponse

__all__ = [
    "BackendNotOwned",
    "ChildRecord",
    "ClientConfig",
    "ConfigError",
    "LimitsConfig",
    "RestartPolicy",
    "LocalRewardBackend",
    "ManagedScorerProcessBackend",
    "ManagedScorerProcessSpec",
    "PrecomputedRewardError",
    "ProcessConfig",
    "RewardBackend",
    "RemoteRewardBackend",
    "RewardContractError",
    "RewardItem",
    "RewardRequest",
    "RewardResponse",
    "RewardService",
    "ScorerConfig",
    "ScorerCrashLoop",
    "ScorerError",
    "ScorerProcessDied",
    "ScorerRequestError",
    "ScorerStartupError",
    "ScorerTimeout",
    "ScorerUnavailable",
]
