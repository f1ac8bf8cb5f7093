"""Media of a group that spans ranks, shipped to the rank that scores it whole: raw bytes, never
JSON.

Why: a groupwise image or video model must see its whole group, and a trainer spreads a prompt's
candidates over ranks. The item's other fields travel in `DistributedRewards`' JSON exchange with
a manifest of its arrays (field, position, shape, dtype, offset); the arrays themselves go as one
byte buffer per rank in a binary gather, and the scoring rank rebuilds them in its backend's arena:
a managed child's shared segment, so they reach the child in place, as its own rank's arrays do.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from scorers import item_fields
from supervisor.arena import Arena
from supervisor.errors import RewardContractError
from supervisor.types import RewardItem

# what an array of each media field may hold (the item's own checks apply once it is rebuilt)
DTYPES = {name: item_fields.BY_NAME[name].dtype for name in item_fields.MEDIA}


def manifest(item: RewardItem, arrays: list[np.ndarray], offset: int) -> tuple[list[Any], int]:
    """The item's arrays appended to `arrays` (contiguous), described from byte `offset` of its
    rank's buffer on ([[field, position or None, shape, dtype, offset], ...]), and the next
    offset."""
    described: list[Any] = []
    for name in item_fields.MEDIA:
        value = getattr(item, name)
        if value is None:
            continue
        many = item_fields.BY_NAME[name].kind == item_fields.ARRAYS
        for position, array in enumerate(value) if many else [(None, value)]:
            array = np.ascontiguousarray(array)
            described.append([name, position, list(array.shape), array.dtype.str, offset])
            arrays.append(array)
            offset += array.nbytes
    return described, offset


def buffer(arrays: list[np.ndarray]) -> bytes:
    """One rank's arrays, back to back, as the manifests' offsets say."""
    return b"".join(array.tobytes() for array in arrays)


def rebuilt(described: list[Any], blob: np.ndarray, arena: Arena, rank: int) -> dict[str, Any]:
    """The media fields of one item from rank `rank`'s buffer, in `arena`; a manifest that does
    not fit its buffer or names an unknown field or dtype is a RewardContractError."""
    fields: dict[str, Any] = {}
    for name, position, shape, dtype, offset in described:
        kind = np.dtype(dtype)
        count = math.prod(shape)
        end = offset + count * kind.itemsize
        if DTYPES.get(name) != kind.name or end > blob.size or offset < 0:
            raise RewardContractError(
                f"rank {rank} shipped media {name!r} {dtype} {shape} at bytes {offset}-{end} of "
                f"its {blob.size}: not an array this exchange carries (ranks on other versions?)"
            )
        array = arena.empty(tuple(shape), kind)
        np.copyto(array, blob[offset:end].view(kind).reshape(shape))
        if position is None:
            fields[name] = array
        else:
            fields.setdefault(name, []).append(array)
    return fields
