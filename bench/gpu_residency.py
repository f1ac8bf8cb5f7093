"""GPU residency check: does offload really give the memory back? (needs CUDA)

`make gpu-check` (or `.venv/bin/python -m bench.gpu_residency`) starts text_similarity
in a managed child on `cuda`, offloads and onloads it a few times, and prints the
CUDA allocated/reserved bytes the child observed, the fraction freed by offload,
and the onload/offload times. Without CUDA it says so and exits 0.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

from supervisor import ManagedScorerProcessBackend, RewardItem, RewardRequest, ScorerStartupError

REPO_ROOT = Path(__file__).resolve().parent.parent  # a checkout: the envs live beside the packages

ROUNDS = 5


def main() -> int:
    spec = {
        "process": {"python_executable": str(REPO_ROOT / "envs/embed/.venv/bin/python"), "startup_timeout": 300},
        "scorer": {"name": "text_similarity", "device": "cuda"},
        "gpu_residency": "resident",
    }
    try:
        backend = ManagedScorerProcessBackend(spec)
    except ScorerStartupError as exc:
        if "CUDA is not available" in str(exc):
            print("gpu_residency: SKIPPED - the embed env sees no CUDA device on this machine")
            return 0
        raise
    request = RewardRequest(
        items=[RewardItem(id=f"t{i}", text="a cat on a mat", reference="the cat sat") for i in range(64)]
    )
    with backend:
        backend.compute_rewards(request)  # activations allocated once, then released by offload
        offloads, onloads = [], []
        for _ in range(ROUNDS):
            offloads.append(backend.offload())
            onloads.append(backend.onload())
            backend.compute_rewards(request)
    resident = statistics.median(o["before"]["cuda_allocated_bytes"] for o in offloads)
    after = statistics.median(o["after"]["cuda_allocated_bytes"] for o in offloads)
    reserved_before = statistics.median(o["before"]["cuda_reserved_bytes"] for o in offloads)
    reserved_after = statistics.median(o["after"]["cuda_reserved_bytes"] for o in offloads)
    print(f"resident: allocated {resident / 2**20:.1f} MiB, reserved {reserved_before / 2**20:.1f} MiB")
    print(f"offloaded: allocated {after / 2**20:.1f} MiB, reserved {reserved_after / 2**20:.1f} MiB")
    print(f"fraction freed: allocated {1 - after / resident:.3f}, reserved {1 - reserved_after / reserved_before:.3f}")
    print(
        f"offload p50 {statistics.median(o['seconds'] for o in offloads) * 1e3:.1f} ms, "
        f"onload p50 {statistics.median(o['seconds'] for o in onloads) * 1e3:.1f} ms ({ROUNDS} rounds)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
