"""Another local user's connection flood against a port: never a byte sent.

`hold PORT COUNT`: open COUNT connections, print one JSON line, hold them until stdin closes.
`churn PORT SECONDS`: open and close batches of 200 connections as fast as possible.
"""

from __future__ import annotations

import json
import resource
import socket
import sys
import time


def connect_many(port: int, count: int) -> list[socket.socket]:
    held = []
    for _ in range(count):
        sock = socket.socket()
        sock.setblocking(False)
        try:
            sock.connect(("127.0.0.1", port))
        except BlockingIOError:
            pass
        held.append(sock)
    return held


def main() -> None:
    mode, port, amount = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    if mode == "hold":
        held = connect_many(port, min(int(amount), hard - 64))
        print(json.dumps({"held": len(held)}), flush=True)
        sys.stdin.read()
        return
    until = time.monotonic() + amount
    while time.monotonic() < until:
        for sock in connect_many(port, 200):
            sock.close()


if __name__ == "__main__":
    main()
