"""Which single GPU a rank's child may see."""

from __future__ import annotations

from collections.abc import Mapping

from supervisor.child.ranks import env_int
from supervisor.errors import ConfigError


def child_visible_devices(
    parent_env: Mapping[str, str],
    local_rank: int | None,
    explicit: str | None = None,
    allow_multiple: bool = False,
    launcher_gpus: tuple[str, ...] | None = None,
) -> str:
    """CUDA_VISIBLE_DEVICES for the child: this rank's one GPU, never the whole node.

    `explicit` wins; then a configured `local_rank`; then the GPUs the launcher gave this
    rank (a Ray actor's, `supervisor.child.ranks`), all of them; otherwise the rank ($LOCAL_RANK,
    else 0) picks one entry of the parent's list (or the device index when the parent sees all).
    """
    if explicit is not None:
        entries = [e for e in explicit.split(",") if e.strip()]
        if len(entries) > 1 and not allow_multiple:
            raise ConfigError(
                f"visible_devices={explicit!r} names {len(entries)} GPUs; one child serves "
                f"one rank's GPU "
                "(set allow_multiple_gpus: true to override)"
            )
        return ",".join(e.strip() for e in entries)
    if launcher_gpus is not None and local_rank is None:
        if len(launcher_gpus) > 1 and not allow_multiple:
            raise ConfigError(
                f"this Ray worker holds GPUs {list(launcher_gpus)}; one child serves one "
                f"rank's GPU: give the "
                "actor num_gpus=1, set process.visible_devices, or set allow_multiple_gpus: true"
            )
        return ",".join(launcher_gpus)
    rank = local_rank if local_rank is not None else env_int(parent_env, "LOCAL_RANK", 0)
    if rank < 0:
        raise ConfigError(f"local rank {rank} is negative")
    parent = parent_env.get("CUDA_VISIBLE_DEVICES")
    if parent is None:
        return str(rank)
    entries = [e.strip() for e in parent.split(",") if e.strip()]
    if not entries:
        return ""
    if len(entries) == 1:
        return entries[0]
    if rank >= len(entries):
        raise ConfigError(f"local rank {rank} has no GPU in CUDA_VISIBLE_DEVICES={parent!r}")
    return entries[rank]
