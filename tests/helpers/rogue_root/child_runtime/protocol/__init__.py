"""The real protocol package, but for `items` (see the package above)."""

from child_runtime import REAL

__path__.append(str(REAL / "protocol"))
