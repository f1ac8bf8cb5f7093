"""Which rank this process is, as its launcher (torchrun, a Ray actor, or none) placed it.

Why: a rank's child must see exactly its rank's device(s), and its logs, errors and metrics
must say which rank they belong to. torchrun says it in the environment (RANK, LOCAL_RANK,
WORLD_SIZE) and leaves every GPU of the node visible, so the local rank picks one. A Ray actor
is handed its GPUs (`ray.get_gpu_ids()`, physical ids) and may carry no rank at all; those GPUs
are the child's, whatever the local rank. Ray is read only when the trainer already imported it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from supervisor.errors import ConfigError

Launcher = Literal["torchrun", "ray", "none"]


@dataclass(frozen=True)
class RankInfo:
    launcher: Launcher
    rank: int  # global: unique in the job, the label on logs, errors and metrics
    local_rank: int  # on this node: picks the GPU when the launcher left all of them visible
    world_size: int
    # the GPUs the launcher gave this rank (Ray); None: pick by local_rank
    gpus: tuple[str, ...] | None = None
    local_world_size: int = 1  # ranks on this node (torchrun's LOCAL_WORLD_SIZE)


def env_int(env: Mapping[str, str], name: str, default: int) -> int:
    """A launcher's non-negative integer variable (RANK, LOCAL_RANK...); ConfigError naming it
    otherwise."""
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not an integer") from None
    if value < 0:
        raise ConfigError(f"{name}={raw!r} is negative")
    return value


def ray_gpus() -> tuple[str, ...] | None:
    """This Ray actor's GPUs, or None outside one (Ray not imported or not initialised, or the
    driver)."""
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return None
    if ray.get_runtime_context().get_actor_id() is None:
        # the driver (or a plain task): ranks are actors; their GPUs are assigned to them
        return None
    return tuple(str(gpu) for gpu in ray.get_gpu_ids())


def current(env: Mapping[str, str] | None = None) -> RankInfo:
    """This process's rank (rank 0 of 1 when nothing launched it as a rank)."""
    env = os.environ if env is None else env
    rank = env_int(env, "RANK", 0)
    local_rank = env_int(env, "LOCAL_RANK", 0)
    world_size = env_int(env, "WORLD_SIZE", max(1, rank + 1))  # a Ray worker may carry RANK alone
    if rank >= world_size:
        raise ConfigError(f"RANK={rank} is not below WORLD_SIZE={world_size}")
    local_world_size = env_int(env, "LOCAL_WORLD_SIZE", 1)
    gpus = ray_gpus()
    if gpus is not None:
        return RankInfo("ray", rank, local_rank, world_size, gpus, local_world_size)
    launcher: Launcher = (
        "torchrun" if "TORCHELASTIC_RUN_ID" in env or "LOCAL_RANK" in env else "none"
    )
    return RankInfo(launcher, rank, local_rank, world_size, None, local_world_size)
