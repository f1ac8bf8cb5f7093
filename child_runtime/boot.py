"""The boot protocol both sides share: a framed config on stdin, one readiness line on a pipe.

The config is framed (an 8-byte length, then JSON) so the child stops reading at its
end: a process forked from the trainer while the child starts may hold the write end
of stdin open for as long as it lives, and end-of-input would never come.
"""

from __future__ import annotations

import json
import struct
from typing import Any, BinaryIO

MAX_BOOT_CONFIG_BYTES = 16 * 1024 * 1024
_LENGTH = struct.Struct("<Q")


def frame(config: dict[str, Any]) -> bytes:
    data = json.dumps(config).encode()
    if len(data) > MAX_BOOT_CONFIG_BYTES:
        raise ValueError(f"boot config is {len(data)} bytes (limit {MAX_BOOT_CONFIG_BYTES})")
    return _LENGTH.pack(len(data)) + data


def _read_exactly(stream: BinaryIO, size: int) -> bytes:
    data = stream.read(size)
    if len(data) != size:
        raise ValueError(f"boot config ended after {len(data)} of {size} bytes")
    return data


def read_frame(stream: BinaryIO) -> dict[str, Any]:
    """The config the parent framed; ValueError when it is short, too large or not a JSON object."""
    (size,) = _LENGTH.unpack(_read_exactly(stream, _LENGTH.size))
    if size > MAX_BOOT_CONFIG_BYTES:
        raise ValueError(f"boot config claims {size} bytes (limit {MAX_BOOT_CONFIG_BYTES})")
    config = json.loads(_read_exactly(stream, size))
    if not isinstance(config, dict):
        raise ValueError(f"boot config is a {type(config).__name__}, not an object")
    return config
