"""`CoordinatedLimiter`: one endpoint's limits across every node, from the cross-node coordinator
(`supervisor.limits`: a Ray actor, or `managed-scorers limits-coordinator`), with the node's share
as the fallback.

`acquire` asks the coordinator for a lease, waiting there within the call's deadline; a grant
carries the rate reservation's delay, slept here, as on a node. Leases are renewed every `RENEW_S`
by one thread, so those of a process that died expire at the coordinator (`board.LEASE_TTL_S`).
When the coordinator cannot be reached (refused, timed out, a 5xx), calls take a conservative
share of the limit on this node: `EndpointLimit.divided(nodes)` through the node's `LocalLimiter`
(shared by the node's processes, so each rank's part is the limit divided by the world size),
never unlimited; the coordinator is asked again `RETRY_S` later. `nodes` is the larger of the
recipe's `nodes:` and the hosts the coordinator last counted (or torchrun's WORLD_SIZE /
LOCAL_WORLD_SIZE); with none known the call fails, naming the coordinator. Stdlib only: it runs in
every scorer env.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import urlsplit

from scorers.limits.board import RENEW_S
from scorers.limits.declared import EndpointLimit
from scorers.limits.errors import LimitConflict, LimitError, LimitStateError, LimitTimeout
from scorers.limits.local import Lease, LocalLimiter

COORDINATOR_ENV = "MANAGED_SCORERS_LIMITS_COORDINATOR"
TOKEN_ENV = "MANAGED_SCORERS_LIMITS_TOKEN"
RETRY_S = 5.0  # after the coordinator failed, calls take the node's share this long
POLL_S = 5.0  # the longest one acquire waits at the coordinator before asking again
CONNECT_S = 3.0  # beyond the poll itself: a coordinator slower than this is unreachable
LOCAL = "local"  # `coordinator: local`: the node's limit, whatever the environment says


class Unreachable(Exception):
    """The coordinator did not answer (refused, timed out, a 5xx): the node's share is taken."""


@dataclass(frozen=True)
class Coordination:
    """Where an endpoint's limit is coordinated, and the node count its fallback divides by."""

    url: str
    token: str
    nodes: int | None = None

    @classmethod
    def split(
        cls, value: Mapping[str, Any], env: Mapping[str, str] | None = None
    ) -> tuple[dict[str, Any], Coordination | None]:
        """A recipe's `endpoint_limit:` without `coordinator` and `nodes`, and the coordination
        they (or `$MANAGED_SCORERS_LIMITS_COORDINATOR`) name; None: the node's limit only."""
        env = os.environ if env is None else env
        rest = {k: v for k, v in value.items() if k not in ("coordinator", "nodes")}
        url = value.get("coordinator", env.get(COORDINATOR_ENV) or LOCAL)
        nodes = value.get("nodes")
        if nodes is not None and (
            isinstance(nodes, bool) or not isinstance(nodes, int) or nodes < 1
        ):
            raise ValueError(f"endpoint_limit: nodes must be a positive int, got {nodes!r}")
        if url == LOCAL:
            return rest, None
        if not isinstance(url, str) or urlsplit(url).scheme != "http" or not urlsplit(url).port:
            raise ValueError(
                f"endpoint_limit: coordinator must be 'local' or http://HOST:PORT, got {url!r}"
            )
        token = env.get(TOKEN_ENV, "")
        if not token:
            raise ValueError(
                f"endpoint_limit: the coordinator {url} needs its token in ${TOKEN_ENV}"
            )
        return rest, cls(url.rstrip("/"), token, nodes)


@dataclass
class RemoteLease:
    """A lease from the coordinator; `end` it exactly once (as `Lease`)."""

    limiter: CoordinatedLimiter
    lease: str
    tokens: int
    waited_s: float
    ended: bool = False

    def end(
        self,
        tokens_used: int | None = None,
        latency_s: float | None = None,
        throttled: bool = False,
        retry_after_s: float | None = None,
    ) -> None:
        if self.ended:
            return
        self.ended = True
        report = {
            "tokens": self.tokens,
            "tokens_used": tokens_used,
            "latency_s": latency_s,
            "throttled": throttled,
            "retry_after_s": retry_after_s,
        }
        self.limiter._ended(self.lease, report)


@dataclass
class _State:
    held: set[str] = field(default_factory=set)
    down_until: float = 0.0
    nodes_seen: int = 0
    lost_ends: int = 0
    share: LocalLimiter | None = None


class CoordinatedLimiter:
    """`limit` for every process of every node whose calls name this coordinator."""

    def __init__(self, limit: EndpointLimit, coordination: Coordination) -> None:
        self.limit, self.coordination = limit, coordination
        url = urlsplit(coordination.url)
        self._host, self._port = url.hostname or "", url.port or 80
        self._me = socket.gethostname()
        self._lock, self._state = threading.Lock(), _State()
        self._connections = threading.local()  # each calling thread keeps one to the coordinator
        self._opened: list[http.client.HTTPConnection] = []
        self._closed = threading.Event()
        self._renewer = threading.Thread(target=self._renew_loop, name="limits-renew", daemon=True)
        self._renewer.start()

    # -- the two calls ----------------------------------------------------------------------
    def acquire(self, tokens: int, deadline: float) -> RemoteLease | Lease:
        if self._closed.is_set():
            raise LimitError(f"endpoint {self.limit.name!r}: the limiter is closed")
        if time.monotonic() >= self._state.down_until:
            try:
                return self._remote(tokens, deadline)
            except Unreachable as exc:
                self._down(str(exc))
        return self._share().acquire(tokens, deadline)

    def close(self) -> None:
        self._closed.set()
        with self._lock:
            share, self._state.share = self._state.share, None
            opened, self._opened = self._opened, []
        for connection in opened:  # a call still in flight on another thread fails: closed
            connection.close()
        if share is not None:
            share.close()

    # -- the coordinator ----------------------------------------------------------------------
    def _exchange(self, what: str, body: bytes, timeout: float) -> tuple[int, bytes]:
        """One POST on this thread's keep-alive connection (a new one if it has none); a kept
        connection the coordinator closed while idle is replaced once, before any answer."""
        for attempt in (0, 1):
            connection = getattr(self._connections, "kept", None)
            reused = connection is not None
            if connection is None:
                connection = http.client.HTTPConnection(self._host, self._port, timeout=timeout)
                with self._lock:
                    self._opened.append(connection)
            if connection.sock is not None:
                connection.sock.settimeout(timeout)
            connection.timeout = timeout
            headers = {"authorization": f"Bearer {self.coordination.token}",
                       "content-type": "application/json"}  # fmt: skip
            try:
                connection.request("POST", f"/limits/{what}", body, headers)
                answer = connection.getresponse()
                raw = answer.read(1 << 20)
            except (OSError, http.client.HTTPException) as exc:
                connection.close()
                self._connections.kept = None
                stale = isinstance(exc, http.client.RemoteDisconnected | BrokenPipeError)
                if reused and stale and attempt == 0:
                    continue
                raise Unreachable(f"{type(exc).__name__}: {exc}") from exc
            self._connections.kept = connection
            return answer.status, raw
        raise AssertionError("unreachable")

    def _post(self, what: str, body: dict[str, Any], timeout: float) -> dict[str, Any]:
        """One POST to /limits/`what`; its JSON answer. Unreachable on anything but an answer."""
        payload = json.dumps({"name": self.limit.name, **body}).encode()
        status, raw = self._exchange(what, payload, timeout)
        if status >= 500:
            raise Unreachable(f"HTTP {status}: {raw[:200]!r}")
        text = raw.decode("utf-8", "replace")
        if status == 409:
            raise LimitConflict(f"coordinator {self.coordination.url}: {text[:400]}")
        if status != 200:
            raise LimitStateError(
                f"coordinator {self.coordination.url} refused /limits/{what}: HTTP {status}: "
                f"{text[:400]}"
            )
        return json.loads(text)

    def _remote(self, tokens: int, deadline: float) -> RemoteLease:
        """Asked in polls of at most `POLL_S`, so a coordinator that stops answering is found
        within `POLL_S + CONNECT_S` whatever the call's deadline."""
        began = time.monotonic()
        while True:
            wait_s = max(deadline - time.monotonic(), 0.0)
            body = {"declared": self.limit.declared(), "tokens": tokens, "wait_s": wait_s,
                    "poll_s": min(wait_s, POLL_S), "host": self._me}  # fmt: skip
            answer = self._post("acquire", body, min(wait_s, POLL_S) + CONNECT_S)
            self._state.nodes_seen = max(self._state.nodes_seen, int(answer.get("nodes", 0)))
            if "again" not in answer:
                break
        if "refused" in answer:
            raise LimitTimeout(
                self.limit.name,
                str(answer["refused"]),
                time.monotonic() - began,
                f"{answer.get('detail', '')} at {self.coordination.url}",
            )
        lease = str(answer["lease"])
        with self._lock:
            self._state.held.add(lease)
        time.sleep(max(float(answer.get("start_in", 0.0)), 0.0))
        return RemoteLease(self, lease, tokens, time.monotonic() - began)

    def _ended(self, lease: str, report: dict[str, Any]) -> None:
        with self._lock:
            self._state.held.discard(lease)
        try:
            self._post("end", {"lease": lease, "report": report}, CONNECT_S)
        except (Unreachable, LimitError) as exc:
            # the call itself went well: the lease expires at the coordinator on its own
            self._state.lost_ends += 1
            print(
                f"managed-scorers: endpoint {self.limit.name!r}: a lease's end did not reach "
                f"{self.coordination.url} ({exc}); it expires there unrenewed",
                file=sys.stderr,
                flush=True,
            )

    def _renew_loop(self) -> None:
        while not self._closed.wait(RENEW_S):
            with self._lock:
                held = sorted(self._state.held)
            if not held:
                continue
            try:
                self._post("renew", {"leases": held}, CONNECT_S)
            except (Unreachable, LimitError) as exc:
                # the next acquire finds the coordinator down and takes the node's share
                print(
                    f"managed-scorers: endpoint {self.limit.name!r}: leases not renewed at "
                    f"{self.coordination.url} ({exc})",
                    file=sys.stderr,
                    flush=True,
                )

    # -- the node's share ---------------------------------------------------------------------
    def _nodes(self) -> int:
        env = os.environ
        launched = 0
        if env.get("WORLD_SIZE", "").isdigit() and env.get("LOCAL_WORLD_SIZE", "").isdigit():
            launched = int(env["WORLD_SIZE"]) // max(int(env["LOCAL_WORLD_SIZE"]), 1)
        return max(self.coordination.nodes or 0, self._state.nodes_seen, launched)

    def _down(self, why: str) -> None:
        nodes = self._nodes()
        if nodes < 1:
            raise LimitStateError(
                f"endpoint {self.limit.name!r}: the coordinator {self.coordination.url} cannot be "
                f"reached ({why}) and no share is known to fall back to: give endpoint_limit "
                f"nodes: N (how many nodes call it)"
            )
        self._state.down_until = time.monotonic() + RETRY_S
        print(
            f"managed-scorers: endpoint {self.limit.name!r}: the coordinator "
            f"{self.coordination.url} cannot be reached ({why}); this node takes 1/{nodes} of "
            f"the limit for {RETRY_S:g} s, then asks again",
            file=sys.stderr,
            flush=True,
        )

    def _share(self) -> LocalLimiter:
        """The node's share, opened once per node count."""
        nodes = self._nodes()
        share = replace(self.limit.divided(nodes), name=f"{self.limit.name} [1/{nodes}]")
        with self._lock:
            current = self._state.share
            if current is not None and current.limit == share:
                return current
            self._state.share = LocalLimiter(share)
        if current is not None:
            current.close()
        return self._state.share

    def share_now(self) -> EndpointLimit | None:
        """The node's share in use, or None while the coordinator answers (to look at)."""
        share = self._state.share
        return (
            share.limit if share is not None and time.monotonic() < self._state.down_until else None
        )
