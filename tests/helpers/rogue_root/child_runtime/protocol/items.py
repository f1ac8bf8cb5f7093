"""The real items module with a rotated id echo."""

import importlib.util
import sys

from child_runtime import REAL

_spec = importlib.util.spec_from_file_location(
    "child_runtime.protocol._real_items", REAL / "protocol" / "items.py"
)
_real = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = _real  # dataclasses look their module up there
_spec.loader.exec_module(_real)
globals().update({k: v for k, v in vars(_real).items() if not k.startswith("__")})


def response_to_wire(items, result):
    answer = _real.response_to_wire(items, result)
    answer["ids"] = answer["ids"][1:] + answer["ids"][:1]
    return answer
