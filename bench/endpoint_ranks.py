"""Light ranks for `bench.endpoint_limits`: one launcher forks N processes that each call a fake
endpoint through `scorers.limits.LocalLimiter` (or without it), as N trainer ranks' judges would.

`python -m bench.endpoint_ranks CONFIG_JSON` prints one JSON summary. It imports only the stdlib and
`scorers.limits` (stdlib only), so a fork costs a page table, not an interpreter start: 512 ranks
fork in well under a second on 2 cores. Each rank opens its own limiter (a forked copy must) and
its own keep-alive connection, says it is ready, and waits at a gate the launcher opens once every
rank is ready, so all begin together. `mode`:

- `calls`: each rank makes `calls` calls, one after another; each call's lease wait and status;
- `loop`: each rank calls until `duration_s` has passed since the gate opened; on a 429 it ends
  its lease throttled and backs off `backoff_s` (the judge's first backoff) before its next call;
- `cost`: one process, `calls` leases taken and ended back to back with nothing to wait for
  (the per-rank cost of the limiter), fixed and adaptive.

Every wait has a deadline; a rank that fails reports its error (type, message, pid) and the
launcher kills what is left at `deadline_s`.
"""

from __future__ import annotations

import http.client
import json
import os
import select
import signal
import sys
import time
import traceback
from collections import Counter
from typing import Any
from urllib.parse import urlsplit

from scorers.limits import (
    CoordinatedLimiter,
    Coordination,
    EndpointLimit,
    EndpointLimiter,
    Lease,
    LocalLimiter,
)

BODY = json.dumps(
    {"model": "judge", "messages": [{"role": "user", "content": "Rate this: x"}]}
).encode()
HEADERS = {"content-type": "application/json"}
TOKENS = 60


def _call(
    conn: http.client.HTTPConnection, limiter: LocalLimiter | None, deadline: float
) -> tuple[int, float, float]:
    """One call, inside a lease when there is a limiter: its status, the lease's wait, when it
    was sent."""
    lease: Lease | None = limiter.acquire(TOKENS, deadline) if limiter else None
    began = time.monotonic()
    try:
        conn.request("POST", "/v1/chat/completions", BODY, HEADERS)
        answer = conn.getresponse()
        answer.read()
    except BaseException:
        if lease is not None:
            lease.end()
        raise
    latency = time.monotonic() - began
    if lease is None:
        return answer.status, 0.0, began
    if answer.status == 429:
        after = answer.getheader("retry-after")
        lease.end(throttled=True, retry_after_s=float(after) if after else None)
    else:
        lease.end(tokens_used=TOKENS, latency_s=latency)
    return answer.status, lease.waited_s, began


def _rank(config: dict[str, Any], gate: int, out: int) -> dict[str, Any]:
    limit = config["limit"]
    limiter = LocalLimiter(EndpointLimit(**limit)) if limit else None
    url = urlsplit(config["url"])
    conn = http.client.HTTPConnection(url.hostname or "", url.port, timeout=config["deadline_s"])
    conn.connect()
    os.write(out, b'{"ready": 1}\n')
    os.read(gate, 1)  # EOF: the launcher closed its end, every rank is ready
    began, cpu = time.monotonic(), time.process_time()
    deadline = began + config["deadline_s"]
    statuses: Counter[int] = Counter()
    waits: list[float] = []
    sent: list[float] = []
    try:
        if config["mode"] == "calls":
            for _ in range(config["calls"]):
                status, waited, at = _call(conn, limiter, deadline)
                statuses[status] += 1
                waits.append(round(waited, 5))
                sent.append(at)
        else:
            until = began + config["duration_s"]
            while time.monotonic() < until:
                status, waited, _ = _call(conn, limiter, deadline)
                statuses[status] += 1
                waits.append(waited)
                if status == 429:  # never past the run's end: the run's time is the ranks' last
                    time.sleep(max(min(config["backoff_s"], until - time.monotonic()), 0.0))
            waits = [round(sorted(waits)[len(waits) // 2], 5)] if waits else []
    finally:
        conn.close()
        if limiter is not None:
            limiter.close()
    ended, cpu = time.monotonic(), time.process_time() - cpu
    return {"statuses": dict(statuses), "waits": waits, "sent": sent, "ended": ended, "cpu": cpu}


def _fork_rank(config: dict[str, Any], gate: tuple[int, int], out: tuple[int, int]) -> int:
    pid = os.fork()
    if pid:
        return pid
    os.close(gate[1])
    os.close(out[0])
    code = 0
    try:
        result = _rank(config, gate[0], out[1])
    except BaseException as exc:  # noqa: BLE001 - reported to the launcher, which raises it
        result = {"error": f"rank pid {os.getpid()}: {type(exc).__name__}: {exc}"}
        traceback.print_exc()
        code = 1
    os.write(out[1], json.dumps(result).encode() + b"\n")
    os._exit(code)


def _read_lines(fd: int, until: float, pending: bytes) -> tuple[list[dict[str, Any]] | None, bytes]:
    """The whole lines that arrive by `until` (TimeoutError past it); None at EOF."""
    left = until - time.monotonic()
    if left <= 0 or not select.select([fd], [], [], left)[0]:
        raise TimeoutError("the ranks did not finish before the deadline")
    chunk = os.read(fd, 65536)
    if not chunk:
        return None, pending
    *lines, rest = (pending + chunk).split(b"\n")
    return [json.loads(line) for line in lines], rest


def launch(config: dict[str, Any]) -> dict[str, Any]:
    """Fork the ranks, open the gate once all are ready, gather what they report."""
    gate, out = os.pipe(), os.pipe()
    forked = time.monotonic()
    pids = [_fork_rank(config, gate, out) for _ in range(config["ranks"])]
    fork_s = time.monotonic() - forked
    os.close(out[1])
    os.close(gate[0])
    until = time.monotonic() + config["deadline_s"] + 60
    results: list[dict[str, Any]] = []
    ready, pending, opened = 0, b"", 0.0
    try:
        while len(results) < len(pids):
            lines, pending = _read_lines(out[0], until, pending)
            if lines is None:
                raise RuntimeError(f"ranks exited without reporting: {len(results)} of {len(pids)}")
            for line in lines:
                if "ready" in line:
                    ready += 1
                else:
                    results.append(line)
            if ready == len(pids) and not opened:
                opened = time.monotonic()
                os.close(gate[1])
    finally:
        for pid in pids:
            if len(results) < len(pids):
                os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
    return {"fork_s": fork_s, "ready_s": opened - forked, "opened": opened, "ranks": results}


def cost(calls: int, adaptive: bool, coordinator: dict[str, str] | None = None) -> float:
    """Microseconds per lease taken and ended with nothing to wait for, one process; from the
    node's files, or from the coordinator at `coordinator` ({"url", "token"})."""
    name = f"cost-{'adaptive' if adaptive else 'fixed'}-{os.getpid()}"
    limit = EndpointLimit(name, 10**9, 10**12, 64, adaptive)
    limiter: EndpointLimiter = (
        LocalLimiter(limit)
        if coordinator is None
        else CoordinatedLimiter(limit, Coordination(coordinator["url"], coordinator["token"]))
    )
    try:
        for _ in range(50):
            limiter.acquire(TOKENS, time.monotonic() + 30).end(TOKENS, 0.05)
        began = time.perf_counter()
        for _ in range(calls):
            limiter.acquire(TOKENS, time.monotonic() + 30).end(TOKENS, 0.05)
        return (time.perf_counter() - began) / calls * 1e6
    finally:
        limiter.close()


def main() -> None:
    config = json.loads(sys.argv[1])
    if config["mode"] == "cost":
        summary = {
            "fixed_us": cost(config["calls"], False),
            "adaptive_us": cost(config["calls"], True),
        }
        if config.get("coordinator"):
            summary["coordinated_us"] = cost(config["calls"], False, config["coordinator"])
    else:
        summary = launch(config)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
