"""Moving torch modules on and off their device, with the memory figures to prove it.

`.to("cpu")` alone frees nothing on CUDA: the caching allocator keeps the blocks
reserved. Offload therefore moves the weights and then calls `empty_cache()`.
Figures are CUDA allocated/reserved bytes where the device is CUDA, process RSS
otherwise. torch is imported lazily: only model scorers' envs have it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import time
from typing import Any


def _libc() -> Any:
    # runs ldconfig: once, at import, never inside a timed move
    name = ctypes.util.find_library("c")
    return ctypes.CDLL(name) if name is not None else None


_LIBC = _libc()


def release_free_heap() -> None:
    """Give freed heap pages back to the OS (glibc malloc_trim), so RSS shows what a move freed.

    Managed children keep freed heap for reuse between requests (see supervisor.backends.managed's
    malloc settings); a residency change is the moment to return it. No-op off glibc.
    """
    if _LIBC is not None and hasattr(_LIBC, "malloc_trim"):
        _LIBC.malloc_trim(0)


def process_rss_bytes() -> int:
    """Resident set size of this process, from /proc (no psutil needed)."""
    with open("/proc/self/statm") as handle:
        pages = int(handle.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE")


def memory_figures(device: str) -> dict[str, int]:
    """What the device holds now: CUDA allocator figures on a GPU, RSS always."""
    figures = {"rss_bytes": process_rss_bytes()}
    if device.startswith("cuda"):
        import torch

        figures["cuda_allocated_bytes"] = int(torch.cuda.memory_allocated(device))
        figures["cuda_reserved_bytes"] = int(torch.cuda.memory_reserved(device))
    return figures


def move_module(module: Any, target: str, figures_device: str) -> dict[str, Any]:
    """Move a torch module to `target`, release cached CUDA blocks, report before/after."""
    import torch

    before = memory_figures(figures_device)
    started = time.perf_counter()
    module.to(target)
    if figures_device.startswith("cuda"):
        torch.cuda.synchronize(figures_device)
        if target == "cpu":
            clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
            # cuBLAS keeps a workspace (32 MiB on Hopper) in the caching allocator
            if clear is not None:
                clear()
            torch.cuda.empty_cache()
    elapsed = time.perf_counter() - started
    release_free_heap()
    return {
        "device": target,
        "seconds": round(elapsed, 6),
        "before": before,
        "after": memory_figures(figures_device),
    }


def resolve_device(requested: str) -> str:
    """'cuda' without a GPU is a config error, never a silent CPU fallback."""
    if requested.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise RuntimeError(
                f"device {requested!r} requested but CUDA is not available in this child "
                f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r})"
            )
    return requested
