"""Hold N idle TCP connections to a port without ever sending a byte (another local user's flood).

Prints one JSON line once every connect has been issued, then holds them until stdin closes.
"""

from __future__ import annotations

import json
import resource
import socket
import sys


def main() -> None:
    port, count = int(sys.argv[1]), int(sys.argv[2])
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    held = []
    for _ in range(min(count, hard - 64)):
        sock = socket.socket()
        sock.setblocking(False)
        try:
            sock.connect(("127.0.0.1", port))
        except BlockingIOError:
            pass
        held.append(sock)
    print(json.dumps({"held": len(held)}), flush=True)
    sys.stdin.read()


if __name__ == "__main__":
    main()
