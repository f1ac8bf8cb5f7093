"""Torch CPU tensors are accepted wherever a numpy array is, read as a view (no copy).

torch stays optional: a tensor is recognised by its type's module, never by importing torch.
"""

from __future__ import annotations

from typing import Any


def is_tensor(value: Any) -> bool:
    return (
        type(value).__module__.startswith("torch")
        and hasattr(value, "numpy")
        and hasattr(value, "device")
    )


def numpy_view(value: Any) -> Any:
    """A torch tensor -> a numpy array sharing its memory; anything else is returned unchanged.

    A tensor on an accelerator, or of a dtype numpy lacks (bfloat16), is refused rather than
    copied behind the caller's back: the fix (`.cpu()`, `.float()`) is theirs to choose.
    """
    if not is_tensor(value):
        return value
    if value.device.type != "cpu":
        raise ValueError(f"a tensor on {value.device} must be moved to the CPU first (.cpu())")
    try:
        return value.detach().numpy()
    # bfloat16 ("unsupported ScalarType"), a conj or neg bit set
    except (TypeError, RuntimeError) as exc:
        raise ValueError(
            f"a {value.dtype} tensor has no numpy view ({exc}): convert it first"
        ) from exc
