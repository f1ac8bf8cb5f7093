"""MultiRemoteRewardBackend over real `managed-scorers serve` processes on real sockets.

The scorer is the probe (len(text) per item, an optional sleep per call): every id's reward is its
own index, so a reward landing on another id shows. Servers are SIGKILLed mid-batch or between
calls; a share is re-sent once to a healthy server, or the call raises naming the dead one."""

from __future__ import annotations

import itertools
import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from supervisor import (
    ConfigError,
    MultiRemoteRewardBackend,
    RemoteRewardBackend,
    RewardContractError,
    RewardItem,
    RewardRequest,
    ScorerIdentityChanged,
    ScorerTimeout,
    ScorerUnavailable,
    build_panel,
    load_recipe,
)
from tests.conftest import eventually, wait_until_gone
from tests.ops.test_cli_serve import start_serve, stop_serve, wait_ready

pytestmark = pytest.mark.slow
TOKEN = "t" * 32
ROOT = str(Path(__file__).resolve().parents[2])
GROUPS, SIZE = 6, 4
REQUEST = RewardRequest(
    items=[
        RewardItem(id=f"r{i}", group_id=f"g{i // SIZE}", text="x" * i) for i in range(GROUPS * SIZE)
    ],
    group_size=SIZE,
)
EXPECTED = [float(i) for i in range(GROUPS * SIZE)]
PROBE, SLOW = ("Probe", 0.0), ("Probe", 0.5)
NAMES = (
    itertools.count()
)  # each serve's readiness and log files  # the slow one has another identity: its params differ


def serve_many(
    tmp_path: Path, specs: list, extra: tuple[str, ...] = ()
) -> list[tuple[subprocess.Popen, str]]:
    """A serve process per (probe class, sleep_s), started together; (process, url) each, once
    ready."""
    started = []
    for scorer, sleep_s in specs:
        args = [
            "--scorer",
            f"tests.helpers.fixture_scorers:{scorer}",
            "--python",
            sys.executable,
            "--input-kind",
        ]
        args += [
            "text",
            "--extra-import-path",
            ROOT,
            "--params",
            json.dumps({"sleep_s": sleep_s}),
            *extra,
        ]
        started.append(start_serve(tmp_path, f"{scorer}-{next(NAMES)}", *args))
    try:
        return [
            (process, f"http://127.0.0.1:{wait_ready(ready)['port']}")
            for process, ready, _ in started
        ]
    except BaseException:
        for process, _, _ in started:
            stop_serve(process)
        raise


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[Callable[..., list[tuple[subprocess.Popen, str]]]]:
    """serve_many; every process stopped, and checked gone (psutil), when the test ends."""
    made: list[tuple[subprocess.Popen, str]] = []

    def make(*specs: tuple[str, float] | str) -> list[tuple[subprocess.Popen, str]]:
        """`make(PROBE, SLOW, ...)`, then any strings: serve arguments for all of them."""
        kinds = [spec for spec in specs if isinstance(spec, tuple)]
        made.extend(
            serve_many(tmp_path, kinds, tuple(spec for spec in specs if isinstance(spec, str)))
        )
        return made[-len(kinds) :]

    yield make
    for process, _ in made:
        if process.poll() is None:
            assert stop_serve(process) == 0
    assert wait_until_gone([process.pid for process, _ in made], 10) == []


def score_while(backend: MultiRemoteRewardBackend, during: Callable[[], None]) -> object:
    """compute_rewards in a thread while `during()` runs here; its response or its exception."""
    outcome: list[object] = []

    def run() -> None:
        try:
            outcome.append(backend.compute_rewards(REQUEST))
        except Exception as exc:  # noqa: BLE001 - handed to the test
            outcome.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    during()
    thread.join(30)
    assert not thread.is_alive() and len(outcome) == 1
    return outcome[0]


def scoring(urls: list[str], timeout_s: float = 10.0) -> None:
    """Wait until every server has a request in flight (its own /health says so)."""
    clients = [RemoteRewardBackend(url, token=TOKEN) for url in urls]
    try:
        assert eventually(lambda: all(c.health()["in_flight"] > 0 for c in clients), timeout_s), (
            "not all scoring"
        )
    finally:
        for client in clients:
            client.close()


def scored_keys(url: str) -> int:
    """Requests a server scored (its idempotency cache's entries: one per chunk it was sent)."""
    with RemoteRewardBackend(url, token=TOKEN) as one:
        return one.health()["idempotency"]["entries"]


def test_two_and_three_servers_score_a_grouped_batch_equal_to_one_server(servers, monkeypatch):
    urls = [url for _, url in servers(PROBE, PROBE, PROBE)]
    with RemoteRewardBackend(urls[0], token=TOKEN, request_batch_size=SIZE) as one:
        alone = one.compute_rewards(REQUEST)
    assert alone.rewards == EXPECTED
    before = [scored_keys(url) for url in urls]
    for count in (2, 3):
        with MultiRemoteRewardBackend(urls[:count], token=TOKEN, request_batch_size=SIZE) as many:
            response = many.compute_rewards(REQUEST)
        assert response.ids == alone.ids and response.rewards == alone.rewards
        assert response.component_rewards == alone.component_rewards
        assert response.diagnostics["probe"]["sample_count"] == GROUPS * SIZE
    # 6 groups: 3 + 3 chunks on two servers, then 2 + 2 + 2 on three (whole groups, none cut)
    assert [scored_keys(url) - b for url, b in zip(urls, before, strict=True)] == [3 + 2, 3 + 2, 2]
    # a recipe term: `base_urls: [..]` (or `base_url: [..]`) is one backend over every server
    monkeypatch.setenv("PROBE_TOKEN", TOKEN)
    remote = {
        "kind": "remote",
        "base_urls": urls,
        "token_env": "PROBE_TOKEN",
        "client": {"request_batch_size": SIZE},
    }
    remote["probe_interval_s"] = 0.5
    with build_panel(load_recipe({"terms": [{"name": "probe", "backend": remote}]}).train) as panel:
        (backend,) = panel.backends
        assert isinstance(backend, MultiRemoteRewardBackend) and backend.base_urls == urls
        assert backend.probe_interval_s == 0.5 and backend.probe_timeout_s == 2.0
        assert panel.compute_rewards(REQUEST).rewards == EXPECTED
    with pytest.raises(ConfigError, match="base_url or base_urls, not both"):
        load_recipe({"terms": [{"name": "probe", "backend": {**remote, "base_url": urls[0]}}]})


def test_servers_of_another_revision_or_params_are_refused_at_construction_naming_both(servers):
    (_, probe), (_, v2), (_, slow) = servers(PROBE, ("ProbeV2", 0.0), SLOW)
    with pytest.raises(ConfigError) as info:
        MultiRemoteRewardBackend([probe, v2], token=TOKEN)
    said = str(info.value)
    assert probe in said and v2 in said and "'probe-v2'" in said and "never mix rewards" in said
    with pytest.raises(ConfigError) as other:
        MultiRemoteRewardBackend([probe, slow], token=TOKEN)
    with RemoteRewardBackend(probe, token=TOKEN) as a, RemoteRewardBackend(slow, token=TOKEN) as b:
        assert a.identity_hash != b.identity_hash
        assert a.identity_hash in str(other.value) and b.identity_hash in str(other.value)


def test_a_server_restarted_under_another_revision_stops_the_next_call_naming_it(servers):
    """Stopped, it is passed over; back under another revision, its background probe finds it and
    the next call raises naming it (a server up when it changes: the next call's own probe, see
    below). Stopped again, it is passed over again: the others serve."""
    (_, first), (second, second_url) = servers(PROBE, PROBE)
    with MultiRemoteRewardBackend(
        [first, second_url], token=TOKEN, request_batch_size=SIZE
    ) as many:
        assert many.compute_rewards(REQUEST).rewards == EXPECTED
        assert stop_serve(second) == 0
        assert many.compute_rewards(REQUEST).rewards == EXPECTED  # the stopped one passed over
        # same URL, other version
        ((changed, _),) = servers(("ProbeV2", 0.0), "--port", second_url.rsplit(":", 1)[1])
        found: list[RewardContractError] = []

        def refused() -> bool:
            try:
                # until then: the first one alone
                assert many.compute_rewards(REQUEST).rewards == EXPECTED
            except ScorerIdentityChanged as exc:
                found.append(exc)
            return bool(found)

        assert eventually(refused, 15)
        assert second_url in str(found[0]) and "'probe-v2'" in str(found[0])
        assert stop_serve(changed) == 0

        def served() -> bool:
            try:
                return many.compute_rewards(REQUEST).rewards == EXPECTED
            except ScorerIdentityChanged:
                return False

        assert eventually(served, 15)


def test_a_server_killed_mid_batch_has_its_share_re_sent_once_to_a_healthy_one(servers):
    made = servers(SLOW, SLOW, SLOW)
    victim = made[1][0]
    with MultiRemoteRewardBackend(
        [url for _, url in made], token=TOKEN, request_batch_size=SIZE
    ) as many:

        def kill_mid_batch() -> None:
            scoring([url for _, url in made])  # every server is scoring its share's first chunk
            victim.send_signal(signal.SIGKILL)
            victim.wait(5)

        began = time.monotonic()
        response = score_while(many, kill_mid_batch)
        assert not isinstance(response, BaseException), response
        # every reward on its own id
        assert response.ids == REQUEST.ids and response.rewards == EXPECTED
        assert time.monotonic() - began < 30  # not the call's 600 s deadline: re-sent at once
        # the other two scored their own 2 chunks each and what the dead one had not answered,
        # re-sent once: both of its chunks, or only its second when load let it answer its first
        # before the kill
        assert GROUPS - 2 < sum(scored_keys(url) for _, url in (made[0], made[2])) <= GROUPS
        # between calls: the dead server does not answer /health, the others take the whole batch
        assert many.compute_rewards(REQUEST).rewards == EXPECTED
    assert victim.poll() == -signal.SIGKILL


def test_with_every_other_server_gone_the_error_names_the_dead_server(servers):
    (first, first_url), (second, second_url) = servers(SLOW, SLOW)
    with MultiRemoteRewardBackend(
        [first_url, second_url], token=TOKEN, request_batch_size=SIZE
    ) as many:
        second.send_signal(signal.SIGKILL)  # between calls: only the first answers /health now
        second.wait(5)

        def kill_mid_batch() -> None:
            scoring([first_url])
            first.send_signal(signal.SIGKILL)
            first.wait(5)

        error = score_while(many, kill_mid_batch)
        assert isinstance(error, ScorerUnavailable), error
        assert first_url in str(error) and "not re-sent (no other healthy server)" in str(error)
        with pytest.raises(ScorerUnavailable) as none:  # nobody answers /health: named, each one
            many.compute_rewards(REQUEST)
        assert first_url in str(none.value) and second_url in str(none.value)


def test_a_server_restarted_mid_call_under_another_identity_is_never_trusted(servers):
    """Issue 37 item 1: B is SIGKILLed while it scores and restarted on its port with other params
    (another identity) while its chunks are in their retries. Neither a RemoteRewardBackend pinned
    to B's identity nor a MultiRemoteRewardBackend over A and B takes one answer of the new
    identity: both calls raise ScorerIdentityChanged naming B's URL and both hashes (never retried,
    never joined with A's rewards), and so does every later call."""
    (_, a), (b_process, b) = servers(SLOW, SLOW)
    patient = {
        "request_batch_size": SIZE,
        "request_timeout": 60,
        "max_retries": 1000,
        "retry_backoff_cap_s": 0.2,
    }
    with RemoteRewardBackend(b, token=TOKEN) as first:
        old = first.identity_hash
    assert old is not None
    outcomes: dict[str, object] = {}

    def call(name: str, backend: RemoteRewardBackend | MultiRemoteRewardBackend) -> None:
        try:
            outcomes[name] = backend.compute_rewards(REQUEST)
        except Exception as exc:  # noqa: BLE001 - handed to the test
            outcomes[name] = exc

    with (
        RemoteRewardBackend(b, token=TOKEN, identity_hash=old, **patient) as one,
        MultiRemoteRewardBackend([a, b], token=TOKEN, **patient) as many,
    ):
        calls = [threading.Thread(target=call, args=("many", many))]
        calls[0].start()
        scoring([a, b])  # the multi-server call's shares are on both servers
        calls.append(threading.Thread(target=call, args=("one", one)))
        calls[1].start()
        b_process.send_signal(signal.SIGKILL)
        b_process.wait(5)
        # the same URL, other params: another identity
        servers(PROBE, "--port", b.rsplit(":", 1)[1])
        with RemoteRewardBackend(b, token=TOKEN) as restarted:
            new = restarted.identity_hash
        assert new is not None and new != old
        for thread in calls:
            thread.join(60)
            assert not thread.is_alive()
        for name, backend in (("one", one), ("many", many)):
            error = outcomes[name]
            assert isinstance(error, ScorerIdentityChanged), (name, error)
            assert (error.url, error.expected, error.got) == (b, old, new), name
            assert all(part in str(error) for part in (b, old, new)), name
            # the next call too, before anything is joined
            with pytest.raises(ScorerIdentityChanged) as later:
                backend.compute_rewards(REQUEST)
            assert (later.value.url, later.value.expected, later.value.got) == (b, old, new), name


def test_a_stopped_server_is_passed_over_without_waiting_for_its_probe_until_it_answers_again(
    servers,
):
    """Issue 37 item 10: B is SIGSTOPped while it scores (unhedged, its chunk spends the call's
    deadline: hedging is test_hedging's). Later calls do not ask B: each is done within
    request_timeout (4 s) although B's probe may take 30 s. After SIGCONT, B answers its background
    probe and takes a share again."""
    (_, a), (b_process, b) = servers(SLOW, SLOW)
    options = {
        "request_batch_size": GROUPS * SIZE,
        "request_timeout": 4,
        "probe_timeout_s": 30,
        "hedge": False,
    }
    with MultiRemoteRewardBackend([a, b], token=TOKEN, **options) as many:
        try:

            def stop_b_mid_batch() -> None:
                scoring([a, b])
                b_process.send_signal(signal.SIGSTOP)

            error = score_while(many, stop_b_mid_batch)
            assert isinstance(error, ScorerTimeout) and b in str(error), error
            for _ in range(2):  # asking B would spend 30 s of a 4 s deadline
                assert many.compute_rewards(REQUEST).rewards == EXPECTED
        finally:
            b_process.send_signal(signal.SIGCONT)
        used = scored_keys(b)  # B answers again (the stopped chunk done)

        def b_takes_a_share() -> bool:
            assert many.compute_rewards(REQUEST).rewards == EXPECTED
            return scored_keys(b) > used

        assert eventually(b_takes_a_share, 15), "B was not used again after SIGCONT"
