"""Shared endpoint limits at rank scale (issue 43): the node's limiter against a hard-limited fake.

Ranks are light processes (`bench.endpoint_ranks`: forked from one launcher that imports only
`scorers.limits`), each calling the fake endpoint below through the real `LocalLimiter`, its
flock'd files in a private temporary `MANAGED_SCORERS_LIMITS_DIR`. Three lines:

- `sim_line`: 512 ranks against an endpoint with a hard limit (requests in flight, and arrivals
  in any trailing second), once bound by concurrency (slow answers) and once by rate (fast
  ones), each with the limiter and without: the endpoint's peaks, its 429s, the ranks' lease
  waits; and the limiter's cost per lease with nothing to wait for. With the limiter the line
  raises unless the peaks stay within the limits and no call is refused.
- `overhead_line`: N ranks calling an unlimited endpoint as fast as they can, with a limiter
  that never binds and without one, interleaved: throughput with / without.
- `adaptive_line`: ranks calling an endpoint whose latency rises with load and that answers 429
  past a capacity the ranks do not know; fixed concurrency settings swept, then the adaptive
  window: its throughput over the best fixed one's.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from http.server import BaseHTTPRequestHandler
from typing import Any

from bench.common import ROOT
from bench.hard_limit import HardLimit, peak_in_window
from bench.loopback_server import LoopbackServer, send_answer

SIM_SMOKE = {"ranks": 24, "calls": 1, "concurrency": 4, "rpm": 3000, "cost_calls": 200}
OVERHEAD_SMOKE = {"ranks": 4, "duration_s": 0.3, "rounds": 1, "latencies_s": (0.0,)}
ADAPTIVE_SMOKE = {"ranks": 8, "capacity": 3, "settings": (2, 4, 8), "duration_s": 0.4, "rounds": 1}
ANSWER = json.dumps(
    {
        "id": "chatcmpl-hard",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "Score: 7"}}],
        "usage": {"total_tokens": 60},
    }
).encode()


class HardLimitEndpoint(HardLimit, LoopbackServer):
    """A fake chat endpoint on loopback that refuses (429) past `concurrency` requests in flight
    or past `per_second` arrivals in the trailing second (`bench.hard_limit`); a request it serves
    waits `base_s + per_load_s * in_flight`."""

    def __init__(self, **limits: Any) -> None:
        HardLimit.__init__(self, **limits)
        # 512 ranks connect at once: no SYN dropped and retried 1 s later
        LoopbackServer.__init__(self, _handler(self), "hard-limit", poll_s=0.1, backlog=2048)
        self.url += "/v1"


def _handler(server: HardLimitEndpoint) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True  # the headers and the body are two writes: no 40 ms ACK wait

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's name
            """Quiet: the line reads the counts."""

        def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
            self.rfile.read(int(self.headers.get("content-length", "0")))
            serve_s = server.admit()
            if serve_s is None:
                body = b'{"error": {"message": "rate limited", "type": "rate_limit"}}'
                send_answer(self, 429, "application/json", body)
                return
            if serve_s:
                time.sleep(serve_s)
            server.done()
            send_answer(self, 200, "application/json", ANSWER)

    return Handler


def run_ranks(config: dict[str, Any], limits_dir: str) -> dict[str, Any]:
    """`bench.endpoint_ranks` with `config`; its summary. Fails naming the ranks' error."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MANAGED_SCORERS_LIMITS_DIR": limits_dir}
    done = subprocess.run(
        [sys.executable, "-m", "bench.endpoint_ranks", json.dumps(config)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=config.get("deadline_s", 60) + 120,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(
            f"bench.endpoint_ranks failed ({done.returncode}): {done.stderr[-3000:]}"
        )
    summary = json.loads(done.stdout)
    errors = [rank["error"] for rank in summary.get("ranks", []) if "error" in rank]
    if errors:
        raise RuntimeError(f"{len(errors)} ranks failed, first: {errors[0]}")
    return summary


def _calls_run(
    endpoint: HardLimitEndpoint, ranks: int, calls: int, limit: dict[str, Any] | None, tmp: str
) -> dict[str, Any]:
    """`ranks` ranks of `calls` calls each, all at once: the endpoint's counts and the waits."""
    endpoint.reset()
    config = {"mode": "calls", "url": endpoint.url, "ranks": ranks, "calls": calls}
    summary = run_ranks({**config, "limit": limit, "deadline_s": 120.0}, tmp)
    waits = sorted(w for rank in summary["ranks"] for w in rank["waits"])
    sent = sorted(t for rank in summary["ranks"] for t in rank["sent"])
    statuses: dict[str, int] = {}
    for rank in summary["ranks"]:
        for status, count in rank["statuses"].items():
            statuses[status] = statuses.get(status, 0) + count
    took = max(rank["ended"] for rank in summary["ranks"]) - summary["opened"]
    return {
        "peak": endpoint.peak_in_flight,
        "peak_1s": endpoint.peak_in_window(1.0),
        "sent_1s": peak_in_window(sent, 1.0),
        "throttled": endpoint.throttled,
        "arrivals": len(endpoint.arrivals),
        "statuses": statuses,
        "wait_p50": waits[len(waits) // 2],
        "wait_p95": waits[int(len(waits) * 0.95)],
        "took": took,
        "fork_s": summary["fork_s"],
    }


def _check_limited(run: dict[str, Any], phase: str, ranks: int, calls: int, limits: str) -> None:
    if run["throttled"] or run["statuses"] != {"200": ranks * calls}:
        raise RuntimeError(f"{phase}, limited ({limits}): the endpoint refused calls: {run}")


def sim_line(
    ranks: int = 512,
    calls: int = 2,
    concurrency: int = 16,
    rpm: int = 12000,
    cost_calls: int = 5000,
) -> str:
    """The 512-rank simulation; the endpoint allows `concurrency` in flight and `rpm`'s bucket
    allowance, 2 x rpm / 60 arrivals in any trailing second (a second's rate, plus the bucket's
    one second of burst)."""
    per_second = 2 * rpm // 60
    limit = {"name": "sim", "requests_per_minute": rpm, "concurrency": concurrency}
    limits = f"{concurrency} in flight, {rpm}/min: <= {per_second} in any 1 s"
    phases = {"concurrency-bound (100 ms answers)": 0.1, "rate-bound (2 ms answers)": 0.002}
    parts = []
    with tempfile.TemporaryDirectory(prefix="endpoint-sim-") as tmp:
        limits_dir = os.path.join(tmp, "limits")
        cost = _lease_costs(cost_calls, limits_dir)
        for phase, latency in phases.items():
            with HardLimitEndpoint(
                concurrency=concurrency, per_second=per_second, base_s=latency
            ) as endpoint:
                limited = _calls_run(endpoint, ranks, calls, limit, limits_dir)
                _check_limited(limited, phase, ranks, calls, limits)
                if limited["peak"] > concurrency or limited["peak_1s"] > per_second:
                    raise RuntimeError(f"{phase}: the endpoint saw more than {limits}: {limited}")
                bare = _calls_run(endpoint, ranks, calls, None, limits_dir)
                if not bare["throttled"]:
                    raise RuntimeError(f"{phase}: without the limiter nothing was refused: {bare}")
            parts.append(
                f"{phase}: limited peak {limited['peak']}/{concurrency} in flight, "
                f"{limited['peak_1s']}/{per_second} in 1 s, "
                f"{limited['arrivals'] / limited['took']:.0f}/s, 0 refused, lease wait "
                f"p50 {limited['wait_p50']:.2f} s p95 {limited['wait_p95']:.2f} s; "
                f"unlimited peak {bare['peak']} in flight, {bare['peak_1s']} in 1 s, "
                f"{bare['throttled']}/{bare['arrivals']} refused (429)"
            )
    return (
        f"{ranks} ranks x {calls} calls (forked in {limited['fork_s']:.2f} s) against an endpoint "
        f"of {limits}: " + "  |  ".join(parts) + f"  |  lease taken+ended, nothing to wait: "
        f"{cost['fixed_us']:.0f} us fixed, {cost['adaptive_us']:.0f} us adaptive, "
        f"{cost['coordinated_us']:.0f} us from a coordinator on loopback"
    )


def _lease_costs(calls: int, limits_dir: str) -> dict[str, float]:
    """A lease's cost from the node's files (fixed, adaptive) and from the cross-node coordinator,
    served here in a thread as a Ray actor serves it."""
    import secrets

    from supervisor.limits.hosting import in_thread

    token = secrets.token_urlsafe(32)
    hosted = in_thread("127.0.0.1", 0, token)
    try:
        coordinator = {"url": hosted.url, "token": token}
        return run_ranks({"mode": "cost", "calls": calls, "coordinator": coordinator}, limits_dir)
    finally:
        hosted.stop()


def _loop_run(
    url: str, ranks: int, limit: dict[str, Any] | None, duration_s: float, tmp: str
) -> dict[str, Any]:
    config = {"mode": "loop", "url": url, "ranks": ranks, "duration_s": duration_s}
    config.update(limit=limit, deadline_s=duration_s + 60, backoff_s=0.5)
    summary = run_ranks(config, tmp)
    good = sum(rank["statuses"].get("200", 0) for rank in summary["ranks"])
    refused = sum(rank["statuses"].get("429", 0) for rank in summary["ranks"])
    took = max(rank["ended"] for rank in summary["ranks"]) - summary["opened"]
    cpu = sum(rank["cpu"] for rank in summary["ranks"])
    return {"per_s": good / took, "refused": refused, "cpu_per_call": cpu / (good + refused)}


def overhead_line(
    ranks: int = 16,
    duration_s: float = 2.0,
    rounds: int = 3,
    latencies_s: tuple[float, ...] = (0.0, 0.02),
) -> str:
    """Throughput with a limiter that never binds (`concurrency` = ranks, 10^9 requests/min)
    over none, interleaved rounds, for an endpoint answering at once and after 20 ms."""
    parts = []
    with tempfile.TemporaryDirectory(prefix="endpoint-overhead-") as tmp:
        limits_dir = os.path.join(tmp, "limits")
        for latency in latencies_s:
            ratios: list[float] = []
            rates: dict[str, list[float]] = {"limited": [], "bare": []}
            cpu: dict[str, list[float]] = {"limited": [], "bare": []}
            with HardLimitEndpoint(base_s=latency) as endpoint:
                for index in range(rounds):
                    name = f"overhead-{latency}-{index}"
                    limit = {"name": name, "requests_per_minute": 10**9, "concurrency": ranks}
                    limited = _loop_run(endpoint.url, ranks, limit, duration_s, limits_dir)
                    bare = _loop_run(endpoint.url, ranks, None, duration_s, limits_dir)
                    for side, run in (("limited", limited), ("bare", bare)):
                        rates[side].append(run["per_s"])
                        cpu[side].append(run["cpu_per_call"])
                    ratios.append(limited["per_s"] / bare["per_s"])
            parts.append(
                f"{latency * 1e3:.0f} ms answers: limited {statistics.median(rates['limited']):.0f}"
                f"/s, bare {statistics.median(rates['bare']):.0f}/s, ratio "
                f"{statistics.median(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f}), a rank's "
                f"CPU per call {statistics.median(cpu['limited']) * 1e6:.0f} us limited, "
                f"{statistics.median(cpu['bare']) * 1e6:.0f} us bare"
            )
    return f"{ranks} ranks calling an unlimited endpoint, limiter overhead: " + "  |  ".join(parts)


def adaptive_line(
    ranks: int = 32,
    capacity: int = 12,
    settings: tuple[int, ...] = (2, 4, 8, 12, 16, 24, 32),
    duration_s: float = 3.0,
    rounds: int = 2,
) -> str:
    """The adaptive window (ceiling: the largest setting) against each fixed setting, on an
    endpoint answering in 20 ms + 1 ms per request in flight, 429 past `capacity` in flight
    (no Retry-After); a refused rank backs off 0.5 s (the judge's first backoff), so a setting
    past the capacity keeps the endpoint full and pays in 429s: the best fixed setting is given
    overall and among those never refused. Throughput: answers per second. The smallest setting
    must never be refused."""
    ceiling = max(settings)
    runs: dict[str, list[dict[str, Any]]] = {str(c): [] for c in settings}
    runs["adaptive"] = []
    with (
        tempfile.TemporaryDirectory(prefix="endpoint-adaptive-") as tmp,
        HardLimitEndpoint(concurrency=capacity, base_s=0.02, per_load_s=0.001) as endpoint,
    ):
        limits_dir = os.path.join(tmp, "limits")
        for index in range(rounds):
            for key in runs:
                adaptive = key == "adaptive"
                limit = {
                    "name": f"adaptive-{key}-{index}",
                    "concurrency": ceiling if adaptive else int(key),
                    "adaptive": adaptive,
                }
                runs[key].append(_loop_run(endpoint.url, ranks, limit, duration_s, limits_dir))

    def mean(key: str, field: str) -> float:
        return statistics.fmean(run[field] for run in runs[key])

    def refused(key: str) -> int:
        return sum(run["refused"] for run in runs[key])

    fixed = [str(c) for c in settings]
    best = max(fixed, key=lambda key: mean(key, "per_s"))
    never_refused = [key for key in fixed if not refused(key)]
    if not never_refused:
        raise RuntimeError(f"every fixed setting was refused (capacity {capacity}): {runs}")
    best_clean = max(never_refused, key=lambda key: mean(key, "per_s"))
    table = "  ".join(f"{key}: {mean(key, 'per_s'):.0f}/s ({refused(key)} 429)" for key in runs)
    ratio = mean("adaptive", "per_s") / mean(best, "per_s")
    clean = mean("adaptive", "per_s") / mean(best_clean, "per_s")
    return (
        f"{ranks} ranks, endpoint capacity {capacity} (hidden), {rounds} x {duration_s:g} s each: "
        f"{table}  |  adaptive/best fixed ({best}) {ratio:.3f}, /best fixed without 429s "
        f"({best_clean}) {clean:.3f}"
    )


if __name__ == "__main__":
    print(sim_line())
    print(overhead_line())
    print(adaptive_line())
