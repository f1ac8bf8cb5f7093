"""Where a trainer builds large input arrays before scoring them (`RewardBackend.arena()`).

`Arena` is the interface; `HeapArena` is ordinary memory, for backends without a shared
segment. A managed child's `SharedArena` (in `child/segment.py`) builds them inside the
segment it shares with the child, so they reach the scorer without a copy.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
import numpy.typing as npt


class Arena(Protocol):
    def empty(self, shape: tuple[int, ...] | int, dtype: npt.DTypeLike = np.uint8) -> np.ndarray:
        """An uninitialised array, valid until the arena is closed."""
        ...

    def close(self) -> None: ...

    def __enter__(self) -> Arena: ...

    def __exit__(self, *exc_info: object) -> None: ...


class HeapArena:
    """The same interface over ordinary memory, for backends without a shared segment."""

    def empty(self, shape: tuple[int, ...] | int, dtype: npt.DTypeLike = np.uint8) -> np.ndarray:
        return np.empty(shape, dtype)

    def close(self) -> None:
        """Nothing to free: the arrays belong to whoever holds them."""

    def __enter__(self) -> HeapArena:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
