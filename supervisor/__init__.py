"""Trainer side of managed-scorers: one RewardBackend interface over in-process,
managed-child and remote scorers.

This module is the facade: every public name, `from supervisor import X`. The modules at the
top of the folder are the trainer contract (types, errors, backend, service, verify, config,
submit, fanout, arena, tensors, scorer_envs) and import no folder of the package; the folders
sit on floors above them, child/ < backends/ < compose/ < adapters/, with ops/ on top
(docs/architecture.md; tests/contract/test_architecture.py checks it).

`supervisor` is also supervisord's import name: where supervisord's files share this package
(`pip install supervisor` in the same env), every name of the facade refuses with one line that
says so and names the fix (scorers/install.py); the CLI says it and exits 2.
"""

import os as _os
from typing import TYPE_CHECKING, Any

# scorers/install.py tells this facade from supervisord's by this line
__distribution__ = "managed-scorers"

try:
    import scorers as _scorers  # noqa: F401 - refuses (SupervisordClash) where supervisord shares this package
except ImportError as _refusal:
    if not getattr(_refusal, "supervisord_clash", False):
        raise
    _CLASH: ImportError | None = _refusal
else:
    _CLASH = None

if _CLASH is None:  # the facade; else each name refuses (__getattr__, below)
    from supervisor.backend import RewardBackend
    from supervisor.backends.jobs import JobRewardBackend
    from supervisor.backends.local import LocalRewardBackend
    from supervisor.backends.managed import ManagedScorerProcessBackend
    from supervisor.backends.remote import RemoteRewardBackend
    from supervisor.compose.distributed import DistributedRewards, RankFailed, RankLost
    from supervisor.compose.overlap import OverlappedScoring, micro_batches, score_while_generating
    from supervisor.compose.panel import BackendPool, PanelTerm, RewardPanel
    from supervisor.compose.ray_pool import RayPoolBackend, RayPoolConfig
    from supervisor.compose.recipes import Recipe, build_panel, build_panels, load_recipe
    from supervisor.compose.remote_servers import MultiRemoteRewardBackend
    from supervisor.compose.replicas import ReplicatedBackend
    from supervisor.config import (
        ClientConfig,
        JobBackendConfig,
        LimitsConfig,
        LocalBackendConfig,
        ManagedScorerProcessSpec,
        PanelConfig,
        ProcessConfig,
        RemoteBackendConfig,
        ReplicasConfig,
        RestartPolicy,
        ScorerConfig,
        TermConfig,
    )
    from supervisor.errors import (
        BackendNotOwned,
        ChildRecord,
        ConfigError,
        GroupsIncomplete,
        GroupSizeConflict,
        JobDeadline,
        JobEnqueueUncertain,
        JobError,
        JobItemsFailed,
        JobProtocolError,
        JobRejected,
        JobServiceUnavailable,
        JobSpoolFailed,
        PoolActorDied,
        PoolIdentityChanged,
        RewardContractError,
        ScorerCrashLoop,
        ScorerError,
        ScorerIdentityChanged,
        ScorerItemsFailed,
        ScorerProcessDied,
        ScorerRequestError,
        ScorerStartupError,
        ScorerTermsFailed,
        ScorerTimeout,
        ScorerUnavailable,
    )
    from supervisor.ops.preflight import PreflightError, PreflightReport, preflight
    from supervisor.service import MissingTokenCountError, PrecomputedRewardError, RewardService
    from supervisor.stream import ItemReward, RewardStream
    from supervisor.submit import SubmissionQueueFull
    from supervisor.types import RewardItem, RewardRequest, RewardResponse, TermFailure

__all__ = [
    "OverlappedScoring",
    "ItemReward",
    "RewardStream",
    "SubmissionQueueFull",
    "micro_batches",
    "score_while_generating",
    "BackendPool",
    "LocalBackendConfig",
    "MissingTokenCountError",
    "PanelConfig",
    "PanelTerm",
    "PreflightError",
    "PreflightReport",
    "Recipe",
    "RemoteBackendConfig",
    "JobBackendConfig",
    "RewardPanel",
    "TermConfig",
    "TermFailure",
    "build_panel",
    "build_panels",
    "load_recipe",
    "preflight",
    "BackendNotOwned",
    "ChildRecord",
    "ClientConfig",
    "ConfigError",
    "GroupsIncomplete",
    "GroupSizeConflict",
    "LimitsConfig",
    "RestartPolicy",
    "DistributedRewards",
    "RankFailed",
    "RankLost",
    "ReplicasConfig",
    "RayPoolBackend",
    "RayPoolConfig",
    "ReplicatedBackend",
    "LocalRewardBackend",
    "ManagedScorerProcessBackend",
    "ManagedScorerProcessSpec",
    "PrecomputedRewardError",
    "ProcessConfig",
    "RewardBackend",
    "RemoteRewardBackend",
    "MultiRemoteRewardBackend",
    "JobRewardBackend",
    "JobDeadline",
    "JobEnqueueUncertain",
    "JobError",
    "JobItemsFailed",
    "JobProtocolError",
    "JobRejected",
    "JobServiceUnavailable",
    "JobSpoolFailed",
    "RewardContractError",
    "RewardItem",
    "RewardRequest",
    "RewardResponse",
    "RewardService",
    "ScorerConfig",
    "ScorerCrashLoop",
    "ScorerError",
    "ScorerIdentityChanged",
    "PoolActorDied",
    "PoolIdentityChanged",
    "ScorerProcessDied",
    "ScorerItemsFailed",
    "ScorerTermsFailed",
    "ScorerRequestError",
    "ScorerStartupError",
    "ScorerTimeout",
    "ScorerUnavailable",
]

if not TYPE_CHECKING:  # a type checker still sees every name, and a typo as an error

    def __getattr__(name: str) -> Any:
        """Reached only for a name the facade lacks: where supervisord shares this package, each of
        ours refuses. A submodule's name is left to the import system, so supervisord's own `from
        supervisor import states` still works where our files came last."""
        if _CLASH is not None and not any(
            _os.path.exists(_os.path.join(folder, name))
            or _os.path.exists(_os.path.join(folder, f"{name}.py"))
            for folder in __path__
        ):
            raise type(_CLASH)(str(_CLASH), name="supervisor")
        raise AttributeError(f"module 'supervisor' has no attribute {name!r}")
