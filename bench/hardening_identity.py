"""Scenarios of issue 37 items 1 and 10 (a scorer server's identity, a stopped server), measured:
rows of bench.hardening.

Public API only, so the same file measures an older tree ("before") and this one ("now"). Real
`managed-scorers serve` processes of the probe scorer (len(text) per item, `sleep_s` per call: its
params, so another `sleep_s` is another identity), SIGKILL, SIGSTOP and a restart on the same port.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench.common import readiness, stop
from supervisor import (
    MultiRemoteRewardBackend,
    RemoteRewardBackend,
    RewardItem,
    RewardRequest,
    RewardResponse,
)

ROOT = Path(__file__).resolve().parent.parent
TOKEN = "h" * 32
SIZE = 4
REQUEST = RewardRequest(
    items=[RewardItem(id=f"r{i}", group_id=f"g{i // SIZE}", text="x" * i) for i in range(6 * SIZE)],
    group_size=SIZE,
)
# every option of the client, typed as the constructor's **options
PATIENT: dict[str, Any] = {
    "request_batch_size": SIZE,
    "request_timeout": 60,
    "max_retries": 1000,
    "retry_backoff_cap_s": 0.2,
}


class Servers:
    """`serve` processes of the probe, each (process, url); all stopped when the block ends."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.made: list[tuple[subprocess.Popen, str]] = []

    def start(self, *sleeps: float, port: int = 0) -> list[tuple[subprocess.Popen, str]]:
        started: list[tuple[subprocess.Popen, Path]] = []
        for sleep_s in sleeps:
            line = self.folder / f"{len(self.made) + len(started)}.json"
            command = [
                sys.executable,
                "-m",
                "supervisor",
                "serve",
                "--scorer",
                "tests.helpers.fixture_scorers:Probe",
            ]
            command += [
                "--python",
                sys.executable,
                "--input-kind",
                "text",
                "--extra-import-path",
                str(ROOT),
            ]
            command += [
                "--params",
                json.dumps({"sleep_s": sleep_s}),
                *(["--port", str(port)] if port else []),
            ]
            with open(line, "w") as out:
                env = {**os.environ, "MANAGED_SCORERS_TOKEN": TOKEN}
                started.append(
                    (
                        subprocess.Popen(command, stdout=out, stderr=subprocess.DEVNULL, env=env),
                        line,
                    )
                )
        try:
            ready = [
                (process, f"http://127.0.0.1:{readiness(line, process, 60)['port']}")
                for process, line in started
            ]
        except BaseException:
            stop(*(process for process, _ in started))
            raise
        self.made.extend(ready)
        return ready

    def stop(self) -> None:
        stop(*(process for process, _ in self.made))


@contextmanager
def servers() -> Iterator[Servers]:
    with tempfile.TemporaryDirectory(prefix="bench-identity-") as folder:
        made = Servers(Path(folder))
        try:
            yield made
        finally:
            made.stop()


def _health(url: str) -> dict:
    with RemoteRewardBackend(url, token=TOKEN) as one:
        return one.health()


def _wait_scoring(urls: list[str]) -> None:
    deadline = time.monotonic() + 30
    while not all(_health(url)["in_flight"] > 0 for url in urls):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{urls} not all scoring")
        time.sleep(0.02)


def _outcome(call: Callable[[], RewardResponse]) -> object:
    try:
        return call()
    except Exception as exc:  # noqa: BLE001 - what happened is the measurement
        return exc


def _said(outcome: object) -> str:
    if isinstance(outcome, RewardResponse):
        return f"{len(outcome.rewards)} rewards, no error"
    expected, got = getattr(outcome, "expected", None), getattr(outcome, "got", None)
    if expected and got:  # ScorerIdentityChanged: the URL and both hashes
        return f"{type(outcome).__name__} ({outcome.url}: {expected[:8]}.. -> {got[:8]}..)"  # type: ignore[attr-defined]
    first = str(outcome).splitlines()[0]
    return (
        f"{type(outcome).__name__}: ...{first[-70:]}"
        if len(first) > 70
        else f"{type(outcome).__name__}: {first}"
    )


def _restart_mid_call(
    backend: RemoteRewardBackend | MultiRemoteRewardBackend, made: Servers, watched: list[str]
) -> str:
    """A call of `backend` in flight; the last server SIGKILLed once `watched` all score, then
    restarted on its port with other params (another identity); what the call and the next one got,
    and how many chunks the restarted server scored (each one taken, when the call returned
    rewards)."""
    victim, url = made.made[-1]
    outcome: list[object] = []
    caller = threading.Thread(
        target=lambda: outcome.append(_outcome(lambda: backend.compute_rewards(REQUEST)))
    )
    caller.start()
    _wait_scoring(watched)
    victim.send_signal(signal.SIGKILL)
    victim.wait(5)
    made.start(0.25, port=int(url.rsplit(":", 1)[1]))
    caller.join(90)
    scored = _health(url)["idempotency"]["entries"]
    later = _outcome(lambda: backend.compute_rewards(REQUEST))
    return (
        f"that call: {_said(outcome[0])}, {scored} chunk(s) scored by the new one; the next: "
        f"{_said(later)}"
    )


def remote_restarted_mid_call() -> str:
    """Item 1: one server, identity_hash pinned, SIGKILLed mid-call and restarted with other
    params."""
    with servers() as made:
        ((_, url),) = made.start(0.5)
        pinned = _health(url)["identity_hash"]
        with RemoteRewardBackend(url, token=TOKEN, identity_hash=pinned, **PATIENT) as remote:
            return _restart_mid_call(remote, made, [url])


def multi_restarted_mid_call() -> str:
    """Item 1: two servers, the second SIGKILLed mid-call and restarted with other params."""
    with servers() as made:
        urls = [url for _, url in made.start(0.5, 0.5)]
        with MultiRemoteRewardBackend(urls, token=TOKEN, **PATIENT) as many:
            return _restart_mid_call(many, made, urls)


def multi_one_stopped() -> str:
    """Item 10: two servers, one SIGSTOPped between calls (default probe_timeout_s 2 s)."""
    with servers() as made:
        (_, first), (stopped, second) = made.start(0.0, 0.0)
        with MultiRemoteRewardBackend(
            [first, second], token=TOKEN, request_batch_size=SIZE
        ) as many:
            many.compute_rewards(REQUEST)
            stopped.send_signal(signal.SIGSTOP)
            took = []
            for _ in range(4):
                began = time.monotonic()
                many.compute_rewards(REQUEST)
                took.append(time.monotonic() - began)
            stopped.send_signal(signal.SIGCONT)
            before = _health(second)["idempotency"]["entries"]
            began = time.monotonic()
            while (
                _health(second)["idempotency"]["entries"] == before
                and time.monotonic() - began < 30
            ):
                many.compute_rewards(REQUEST)
            back = time.monotonic() - began
    later = ", ".join(f"{s:.2f}" for s in took[1:])
    return (
        f"calls after the stop: {took[0]:.2f} s, then {later} s; after SIGCONT used again "
        f"within {back:.2f} s"
    )


SCENARIOS = [
    (
        "remote: server restarted mid-call under other params, hash pinned (issue 37 item 1)",
        remote_restarted_mid_call,
    ),
    (
        "several servers: one restarted mid-call under other params (issue 37 item 1)",
        multi_restarted_mid_call,
    ),
    ("several servers: one SIGSTOPped (issue 37 item 10)", multi_one_stopped),
]
