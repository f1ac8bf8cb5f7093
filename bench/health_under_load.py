"""`/health` latency while four clients load one child, against the same child idle (one run).

`python -m bench.health_under_load`: a managed `constant` child (envs/image); a poller times
`GET /health` alone, then while four RemoteRewardBackends send 1-3 item requests as fast as
they can. The control thread must keep answering: the line prints p50 / p99 / max of each
phase and the loaded p99 over the idle p99. (The test suite checks that every answer comes,
and for its own sample; a latency bound lives here, where noise is compared, not asserted.)
"""

from __future__ import annotations

import threading
import time

import httpx
import numpy as np

from supervisor import RemoteRewardBackend, RewardItem, RewardRequest

CLIENTS = 4
REQUESTS_PER_CLIENT = 300
IDLE_POLLS = 300


def _poll(http: httpx.Client, stop: threading.Event, limit: int | None) -> list[float]:
    """At least one poll, then until `stop` or `limit` (a short load may end before the first)."""
    latencies: list[float] = []
    while not latencies or (not stop.is_set() and (limit is None or len(latencies) < limit)):
        started = time.perf_counter()
        http.get("/health").raise_for_status()
        latencies.append(time.perf_counter() - started)
        time.sleep(0.001)
    return latencies


def _load(remote: RemoteRewardBackend, client: int, requests: int) -> None:
    for request_no in range(requests):
        count = 1 + (client + request_no) % 3
        items = [RewardItem(id=f"c{client}-{request_no}-{k}", text="x") for k in range(count)]
        remote.compute_rewards(RewardRequest(items=items))


def _figures(latencies: list[float]) -> tuple[float, float, float]:
    ms = np.array(latencies) * 1e3
    return float(np.percentile(ms, 50)), float(np.percentile(ms, 99)), float(ms.max())


def main_line(
    clients: int = CLIENTS, requests: int = REQUESTS_PER_CLIENT, idle_polls: int = IDLE_POLLS
) -> str:
    from bench.common import managed
    from bench.handles import child_of, port_of

    with managed("image", "constant", "text", {}) as backend:
        token = child_of(backend).token
        url = f"http://127.0.0.1:{port_of(backend)}"
        headers = {"authorization": f"Bearer {token}"}
        with httpx.Client(base_url=url, trust_env=False, timeout=10, headers=headers) as http:
            http.get("/health").raise_for_status()  # connection set up, untimed
            idle = _poll(http, threading.Event(), idle_polls)
            remotes = [
                RemoteRewardBackend(url, token=token, request_timeout=60) for _ in range(clients)
            ]
            stop, loaded = threading.Event(), []
            poller = threading.Thread(
                target=lambda: loaded.extend(_poll(http, stop, None)), name="health"
            )
            workers = [
                threading.Thread(target=_load, args=(r, c, requests), name=f"load-{c}")
                for c, r in enumerate(remotes)
            ]
            poller.start()
            for worker in workers:
                worker.start()
            for worker in workers:
                worker.join(timeout=300)
            stop.set()
            poller.join(timeout=30)
            for remote in remotes:
                remote.close()
    (i50, i99, imax), (l50, l99, lmax) = _figures(idle), _figures(loaded)
    return (
        f"/health under {clients}-client load  idle p50/p99/max "
        f"{i50:.2f}/{i99:.2f}/{imax:.2f} ms  loaded {l50:.2f}/{l99:.2f}/{lmax:.2f} ms "
        f"({len(loaded)} polls)  p99 ratio {l99 / i99:.2f}"
    )


if __name__ == "__main__":
    print(main_line())
