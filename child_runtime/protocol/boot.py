"""The boot protocol both sides share: a framed config on stdin, one readiness line on a pipe.

The config is framed (an 8-byte length, then JSON) so the child stops reading at its
end: a process forked from the trainer while the child starts may hold the write end
of stdin open for as long as it lives, and end-of-input would never come. Reading it
has a deadline too, for the parent that dies before writing it while such a fork lives.
"""

from __future__ import annotations

import json
import os
import select
import struct
import time
from typing import Any

MAX_BOOT_CONFIG_BYTES = 16 * 1024 * 1024
READ_TIMEOUT_S = 60.0  # the parent writes it right after the spawn; past this, nobody will
_LENGTH = struct.Struct("<Q")


def frame(config: dict[str, Any]) -> bytes:
    data = json.dumps(config).encode()
    if len(data) > MAX_BOOT_CONFIG_BYTES:
        raise ValueError(f"boot config is {len(data)} bytes (limit {MAX_BOOT_CONFIG_BYTES})")
    return _LENGTH.pack(len(data)) + data


def _read_exactly(fd: int, size: int, deadline: float) -> bytes:
    data = bytearray()
    while len(data) < size:
        if not select.select([fd], [], [], max(0.0, deadline - time.monotonic()))[0]:
            raise ValueError(
                f"boot config incomplete after {READ_TIMEOUT_S} s ({len(data)} of {size} bytes)"
            )
        chunk = os.read(fd, size - len(data))
        if not chunk:
            raise ValueError(f"boot config ended after {len(data)} of {size} bytes")
        data += chunk
    return bytes(data)


def read_frame(fd: int) -> dict[str, Any]:
    """The config the parent framed; ValueError when it is short, late, too large or not a JSON
    object."""
    deadline = time.monotonic() + READ_TIMEOUT_S
    (size,) = _LENGTH.unpack(_read_exactly(fd, _LENGTH.size, deadline))
    if size > MAX_BOOT_CONFIG_BYTES:
        raise ValueError(f"boot config claims {size} bytes (limit {MAX_BOOT_CONFIG_BYTES})")
    config = json.loads(_read_exactly(fd, size, deadline))
    if not isinstance(config, dict):
        raise ValueError(f"boot config is a {type(config).__name__}, not an object")
    return config


def close_strays(keep: set[int]) -> None:
    """Close every inheritable descriptor above 2 that is not in `keep`: what the trainer left open
    without close-on-exec (posix_spawn, unlike Popen's close_fds, passes those on). This process
    opens its own descriptors close-on-exec, so an inheritable one came from the parent."""
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd <= 2 or fd in keep:
            continue
        try:
            if os.get_inheritable(fd):
                os.close(fd)
        except OSError:  # the listing's own descriptor, closed by now
            continue
