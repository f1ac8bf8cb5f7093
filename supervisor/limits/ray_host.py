"""The coordinator as a named Ray actor: the default where the trainer runs on Ray.

`coordinate_on_ray()` finds the cluster's coordinator actor, or starts it (detached, restarted by
Ray, no CPU reserved: it waits on sockets), and puts its address and token in this process's
environment, where the managed children started afterwards find them; it answers the same two
variables for the `runtime_env` of ranks or actors on other nodes. The actor serves the
coordinator on its node's address (a free port) in a thread. Ray is the default over a panel
server when both run: every process of the cluster can find the actor by name, with no address to
hand around, and Ray restarts it; a coordinator Ray restarted has a new port and token, and callers
take their node's share until they are restarted with the new ones (never unlimited).
"""

from __future__ import annotations

import os
import secrets
from typing import Any

from scorers.limits.remote import COORDINATOR_ENV, TOKEN_ENV

ACTOR = "managed-scorers-limits"
NAMESPACE = "managed-scorers"


class LimitsCoordinatorActor:
    """Serves the coordinator on this node's address for as long as the actor lives."""

    def __init__(self) -> None:
        import ray

        from supervisor.limits.hosting import in_thread

        self.token = secrets.token_urlsafe(32)
        self.hosted = in_thread(_node_address(ray), 0, self.token)

    def address(self) -> dict[str, str]:
        return {COORDINATOR_ENV: self.hosted.url, TOKEN_ENV: self.token}


def _node_address(ray: Any) -> str:
    """This node's address as the cluster knows it (`--node-ip-address`), not a guess."""
    here = ray.get_runtime_context().get_node_id()
    return next(n["NodeManagerAddress"] for n in ray.nodes() if n["NodeID"] == here)


def coordinate_on_ray(timeout_s: float = 60.0, **options: Any) -> dict[str, str]:
    """The cluster's coordinator (started if none runs), set in `os.environ`; the variables, for
    other processes' `runtime_env`. `options`: Ray's actor options (placement, resources)."""
    import ray

    from supervisor.limits.hosting import needs_serving

    needs_serving("coordinate_on_ray (its actor serves the coordinator)")
    actor = (
        ray.remote(LimitsCoordinatorActor)
        .options(
            name=ACTOR,
            namespace=NAMESPACE,
            lifetime="detached",
            get_if_exists=True,
            max_restarts=-1,
            num_cpus=0,
            **options,
        )
        .remote()
    )
    address: dict[str, str] = ray.get(actor.address.remote(), timeout=timeout_s)
    os.environ.update(address)
    return address


def stop_on_ray() -> None:
    """End the cluster's coordinator, if one runs (its callers then take their node's share)."""
    import ray

    try:
        actor = ray.get_actor(ACTOR, namespace=NAMESPACE)
    except ValueError:
        return
    ray.kill(actor)
