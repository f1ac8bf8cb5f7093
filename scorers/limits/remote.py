"""`CoordinatedLimiter`: one endpoint's limits across every node, from the cross-node coordinator
(`supervisor.limits`: a Ray actor, or `managed-scorers limits-coordinator`), with the node's share
as the fallback.

`acquire` asks the coordinator for a lease, waiting there within the call's deadline; a grant
carries the rate reservation's delay, slept here, as on a node. One thread renews the leases held
every `RENEW_S` (those of a process that died expire at the coordinator, `board.LEASE_TTL_S`) and
sends the calls' ends, so no call waits on them.
When the coordinator cannot be reached (refused, timed out, a 5xx), calls take a conservative
share of the limit on this node: `EndpointLimit.divided(nodes)` through the node's `LocalLimiter`
(shared by the node's processes, so each rank's part is the limit divided by the world size),
never unlimited; the coordinator is asked again `RETRY_S` later. `nodes` is the recipe's `nodes:`,
else torchrun's WORLD_SIZE / LOCAL_WORLD_SIZE (both the same in every process of a node, so they
all share one share), else the hosts the coordinator counted; with none known the call fails,
naming the coordinator. Stdlib only: it runs in every scorer env.
"""

from __future__ import annotations

import http.client
import json
import os
import queue
import socket
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any
from urllib.parse import urlsplit

from scorers.limits.board import RENEW_S
from scorers.limits.declared import EndpointLimit
from scorers.limits.errors import LimitConflict, LimitError, LimitStateError, LimitTimeout
from scorers.limits.lease import EndpointLease, Report
from scorers.limits.local import Lease, LocalLimiter

COORDINATOR_ENV = "MANAGED_SCORERS_LIMITS_COORDINATOR"
TOKEN_ENV = "MANAGED_SCORERS_LIMITS_TOKEN"
RETRY_S = 5.0  # after the coordinator failed, calls take the node's share this long
POLL_S = 5.0  # the longest one acquire waits at the coordinator before asking again
CONNECT_S = 3.0  # beyond the poll itself: a coordinator slower than this is unreachable
LATE_S = 0.5  # the most an acquire may outlast its call's deadline, however slow the coordinator
MAX_WAIT_S = 3600.0  # the coordinator's bound on one wait (a longer deadline asks again)
# a kept connection the coordinator closed while it was idle: replaced once
STALE = (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError)
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
class RemoteLease(EndpointLease):
    """A lease from the coordinator: its end goes there, sent by the limiter's keeper thread."""

    limiter: CoordinatedLimiter
    lease: str
    tokens: int
    waited_s: float
    ended: bool = False

    def _over(self, report: Report) -> None:
        self.limiter._ended(self.lease, {"tokens": self.tokens, **asdict(report)})


@dataclass
class _State:
    held: set[str] = field(default_factory=set)
    down_until: float = 0.0
    nodes_seen: int = 0
    lost_ends: int = 0
    lost_leases: int = 0
    share: LocalLimiter | None = None


class _Connections:
    """Kept connections to the coordinator, shared by the threads that call it: a thread takes an
    idle one (or opens one) for one exchange and gives it back; at most as many stay open as
    threads ever called at once, whatever the threads' lifetimes (a judge starts new ones per
    batch). Closed: each is closed as it comes back."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self._lock = threading.Lock()
        self._idle: list[http.client.HTTPConnection] = []
        self._closed = False

    def take(self) -> tuple[http.client.HTTPConnection, bool]:
        """A connection, and whether it was kept (may have been closed by the server meanwhile)."""
        with self._lock:
            if self._idle:
                return self._idle.pop(), True
        return http.client.HTTPConnection(self.host, self.port), False

    def give(self, connection: http.client.HTTPConnection) -> None:
        with self._lock:
            if not self._closed:
                self._idle.append(connection)
                return
        connection.close()

    def close(self) -> None:
        with self._lock:
            self._closed, idle, self._idle = True, self._idle, []
        for connection in idle:
            connection.close()


class CoordinatedLimiter:
    """`limit` for every process of every node whose calls name this coordinator. One thread
    (`_keep`) renews the leases held and sends the ends of the calls, so a call never waits for
    its lease's end to reach the coordinator."""

    def __init__(self, limit: EndpointLimit, coordination: Coordination) -> None:
        self.limit, self.coordination = limit, coordination
        url = urlsplit(coordination.url)
        self._connections = _Connections(url.hostname or "", url.port or 80)
        self._me = socket.gethostname()
        self._lock, self._state = threading.Lock(), _State()
        self._ends: queue.Queue[tuple[str, dict[str, Any]]] = queue.Queue()
        self._closed = threading.Event()
        self._keeper = threading.Thread(target=self._keep, name="limits-keeper", daemon=True)
        self._keeper.start()

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
        """No new lease; the keeper sends the ends queued (a lease ended later expires at the
        coordinator unrenewed, within `LEASE_TTL_S`), then the connections close."""
        self._closed.set()
        self._ends.put(("", {}))  # wakes the keeper
        with self._lock:
            share, self._state.share = self._state.share, None
        if share is not None:
            share.close()

    # -- the coordinator ----------------------------------------------------------------------
    def _exchange(self, what: str, body: bytes, timeout: float) -> tuple[int, bytes]:
        """One POST on a kept connection (or a new one); a kept one the coordinator closed while
        idle is replaced once. Unreachable on anything but an answer."""
        headers = {"authorization": f"Bearer {self.coordination.token}",
                   "content-type": "application/json"}  # fmt: skip
        for attempt in (0, 1):
            connection, kept = self._connections.take()
            connection.timeout = timeout
            try:
                if connection.sock is not None:
                    connection.sock.settimeout(timeout)
                connection.request("POST", f"/limits/{what}", body, headers)
                answer = connection.getresponse()
                raw = answer.read(1 << 20)
            except (OSError, http.client.HTTPException) as exc:
                connection.close()
                if kept and attempt == 0 and isinstance(exc, STALE):
                    continue
                raise Unreachable(f"{type(exc).__name__}: {exc}") from exc
            if answer.isclosed():  # read whole: the connection may serve the next exchange
                self._connections.give(connection)
            else:
                connection.close()
            return answer.status, raw
        raise AssertionError("a second attempt returns or raises")

    def _post(self, what: str, body: dict[str, Any], timeout: float) -> dict[str, Any]:
        """One POST to /limits/`what`; its JSON answer. Unreachable on anything but an answer."""
        payload = json.dumps({"name": self.limit.name, **body}).encode()
        status, raw = self._exchange(what, payload, timeout)
        if status >= 500:
            raise Unreachable(f"HTTP {status}: {raw[:200]!r}")
        text = raw.decode("utf-8", "replace")
        if status == 409:
            raise LimitConflict(f"coordinator {self.coordination.url}: {text[:400]}")
        try:
            answer = json.loads(text) if status == 200 else None
        except ValueError:
            answer = None
        if not isinstance(answer, dict):
            raise LimitStateError(
                f"coordinator {self.coordination.url} refused /limits/{what}: HTTP {status}: "
                f"{text[:400]}"
            )
        return answer

    def _remote(self, tokens: int, deadline: float) -> RemoteLease:
        """Asked in polls of at most `POLL_S`, so a coordinator that stops answering is found
        within `POLL_S + CONNECT_S`, and never more than `LATE_S` past the call's deadline."""
        began = time.monotonic()
        while True:
            wait_s = min(max(deadline - time.monotonic(), 0.0), MAX_WAIT_S)
            poll_s = min(wait_s, POLL_S)
            body = {"declared": self.limit.declared(), "tokens": tokens, "wait_s": wait_s,
                    "poll_s": poll_s, "host": self._me}  # fmt: skip
            answer = self._post("acquire", body, min(poll_s + CONNECT_S, wait_s + LATE_S))
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
        self._ends.put((lease, report))

    def _keep(self) -> None:
        """Send each end as it comes, renew the held leases every `RENEW_S`; after close, the ends
        queued, then the connections closed. A failure is said (the child's log), never raised:
        the calls went well, and a lease not renewed or ended expires at the coordinator."""
        renew_at = time.monotonic() + RENEW_S
        while True:
            try:
                lease, report = self._ends.get(timeout=max(renew_at - time.monotonic(), 0.0))
            except queue.Empty:
                lease, report = "", {}
            if lease:
                self._send_end(lease, report)
            if self._closed.is_set() and self._ends.empty():
                break
            if time.monotonic() >= renew_at:
                self._renew()
                renew_at = time.monotonic() + RENEW_S
        self._connections.close()

    def _send_end(self, lease: str, report: dict[str, Any]) -> None:
        try:
            self._post("end", {"lease": lease, "report": report}, CONNECT_S)
        except (Unreachable, LimitError) as exc:
            self._state.lost_ends += 1
            self._warn(f"a lease's end did not reach {self.coordination.url} ({exc}); it expires "
                       "there unrenewed")  # fmt: skip

    def _renew(self) -> None:
        with self._lock:
            held = sorted(self._state.held)
        if not held:
            return
        try:
            unknown = self._post("renew", {"leases": held}, CONNECT_S).get("unknown") or []
        except (Unreachable, LimitError) as exc:
            # the next acquire finds the coordinator down and takes the node's share
            self._warn(f"leases not renewed at {self.coordination.url} ({exc})")
            return
        if unknown:  # expired there (a coordinator restarted, a long stall): no longer counted
            self._state.lost_leases += len(unknown)
            with self._lock:
                self._state.held.difference_update(unknown)
            self._warn(f"{len(unknown)} lease(s) had expired at {self.coordination.url}")

    def _warn(self, what: str) -> None:
        """One line on stderr (the child's log): what the coordinator did not get, and why."""
        print(f"managed-scorers: endpoint {self.limit.name!r}: {what}", file=sys.stderr, flush=True)

    # -- the node's share ---------------------------------------------------------------------
    def _nodes(self) -> int:
        """The recipe's `nodes`, else torchrun's count, else the hosts the coordinator counted:
        the first two are the same in every process of the node, so all open one share."""
        env = os.environ
        if self.coordination.nodes:
            return self.coordination.nodes
        if env.get("WORLD_SIZE", "").isdigit() and env.get("LOCAL_WORLD_SIZE", "").isdigit():
            return int(env["WORLD_SIZE"]) // max(int(env["LOCAL_WORLD_SIZE"]), 1)
        return self._state.nodes_seen

    def _down(self, why: str) -> None:
        nodes = self._nodes()
        if nodes < 1:
            raise LimitStateError(
                f"endpoint {self.limit.name!r}: the coordinator {self.coordination.url} cannot be "
                f"reached ({why}) and no share is known to fall back to: give endpoint_limit "
                f"nodes: N (how many nodes call it)"
            )
        self._state.down_until = time.monotonic() + RETRY_S
        self._warn(
            f"the coordinator {self.coordination.url} cannot be reached ({why}); this node takes "
            f"1/{nodes} of the limit for {RETRY_S:g} s, then asks again"
        )

    def _share(self) -> LocalLimiter:
        """The node's share, opened once per node count."""
        nodes = self._nodes()
        share = replace(self.limit.divided(nodes), name=f"{self.limit.name} [1/{nodes}]")
        with self._lock:
            current = self._state.share
            if current is not None and current.limit == share:
                return current
            opened = self._state.share = LocalLimiter(share)
        if current is not None:
            current.close()  # its leases still out end on its files (LocalLimiter.close)
        return opened

    def share_now(self) -> EndpointLimit | None:
        """The node's share in use, or None while the coordinator answers (to look at)."""
        with self._lock:
            share = self._state.share
        return (
            share.limit if share is not None and time.monotonic() < self._state.down_until else None
        )
