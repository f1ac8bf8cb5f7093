"""One limit per endpoint for every process of the node (scorers.limits) and the judge's
`endpoint_limit`: 8 ranks against a fake endpoint with limits of its own (tests/helpers/
limited_openai.py), a lease of a rank killed -9 given back, the deadline, tokens reconciled, and a
private directory another user cannot reach."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from scorers.base import ScoreItem
from scorers.builtin.llm_judge import LlmJudge
from scorers.limits import (
    EndpointLimit,
    LimitConflict,
    LimitError,
    LimitStateError,
    LocalLimiter,
    window,
)
from scorers.limits.bucket import Levels
from scorers.limits.rundir import DIR_ENV
from scorers.limits.slots import Slots
from supervisor import LocalRewardBackend, RewardItem, RewardRequest, ScorerItemsFailed
from tests.conftest import REPO_ROOT, env_python, eventually
from tests.helpers.limited_openai import JUDGE, LimitedOpenAI

RANKS = 8
RANK = REPO_ROOT / "tests" / "helpers" / "judge_rank.py"


@pytest.fixture(autouse=True)
def limits_dir(tmp_path, monkeypatch) -> Path:
    path = tmp_path / "limits"
    monkeypatch.setenv(DIR_ENV, str(path))
    return path


def _ranks(phases: list[dict], limits: Path, count: int = RANKS) -> list[subprocess.Popen]:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), DIR_ENV: str(limits)}
    python = env_python("image")
    return [
        subprocess.Popen(
            [str(python), str(RANK), json.dumps(phases)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        for _ in range(count)
    ]


def _start(ranks: list[subprocess.Popen]) -> None:
    """Every rank ready, then all started at once."""
    for rank in ranks:
        assert rank.stdout is not None and rank.stdout.readline().strip() == "ready"
    for rank in ranks:
        assert rank.stdin is not None
        rank.stdin.write("go\n")
        rank.stdin.flush()


def _phase(ranks: list[subprocess.Popen]) -> list[dict]:
    """Every rank started at once; their results."""
    _start(ranks)
    return [json.loads(rank.stdout.readline()) for rank in ranks if rank.stdout is not None]


@pytest.mark.slow
def test_eight_ranks_keep_within_the_endpoints_limit_only_with_the_shared_limit(limits_dir):
    """Today (no endpoint_limit) 8 ranks x concurrency 8 pass the endpoint's 3 in flight and it
    answers 429s; with `endpoint_limit` {600/min, 3 in flight} it never sees more than 3 at once or
    more than its 24 a second, refuses nothing, and every item is judged on its first request."""
    items = 4
    with LimitedOpenAI(concurrency=3, per_second=24, base_s=0.1) as today:
        with LimitedOpenAI(concurrency=3, per_second=24, base_s=0.1) as shared:
            limit = {"requests_per_minute": 600, "concurrency": 3}
            phases = [
                {"params": {**JUDGE, "base_url": today.base_url}, "items": items},
                {
                    "params": {**JUDGE, "base_url": shared.base_url, "endpoint_limit": limit},
                    "items": items,
                },
            ]
            ranks = _ranks(phases, limits_dir)
            try:
                _phase(ranks)
                limited = _phase(ranks)
                assert [rank.wait(timeout=30) for rank in ranks] == [0] * RANKS
            finally:
                for rank in ranks:
                    rank.kill()
                    rank.wait()
    assert today.throttled > 0 and today.peak_in_flight > 3, vars(today)
    assert [(r["rewards"], r["errors"]) for r in limited] == [([0.7] * items, {})] * RANKS
    assert shared.throttled == 0 and shared.peak_in_flight <= 3, vars(shared)
    assert shared.peak_per_second() <= 24 and len(shared.arrivals) == RANKS * items
    assert sum(r["limit_waits"] for r in limited) > 0


def test_a_lease_of_a_rank_killed_mid_call_is_given_back(limits_dir):
    """A rank holds the endpoint's one slot in a call that does not end; while it lives, another
    judge's item fails at its deadline naming the endpoint, the limit and the holder's pid; once it
    is killed -9 the slot is free at once."""
    limit = {"name": "shared-judge", "concurrency": 1}
    with LimitedOpenAI(base_s=30) as stuck, LimitedOpenAI() as fine:
        params = {**JUDGE, "base_url": stuck.base_url, "endpoint_limit": limit}
        [rank] = _ranks([{"params": params, "items": 1}], limits_dir, count=1)
        try:
            _start([rank])
            assert eventually(lambda: stuck.in_flight == 1, timeout=30)
            params = {**JUDGE, "base_url": fine.base_url, "endpoint_limit": limit}
            with LocalRewardBackend("llm_judge", params={**params, "batch_timeout_s": 1}) as judge:
                with pytest.raises(ScorerItemsFailed) as info:
                    judge.compute_rewards(RewardRequest(items=[RewardItem(id="a", text="x")]))
            message = str(info.value)
            assert "endpoint 'shared-judge': its concurrency" in message, message
            assert f"pids [{rank.pid}]" in message and fine.arrivals == []
            rank.send_signal(signal.SIGKILL)
            rank.wait(timeout=10)
            with LocalRewardBackend("llm_judge", params=params) as judge:
                got = judge.compute_rewards(RewardRequest(items=[RewardItem(id="a", text="x")]))
            assert got.rewards == [0.7]
        finally:
            rank.kill()
            rank.wait()


def test_a_wait_past_the_deadline_fails_the_item_naming_the_endpoint_and_its_limit():
    """60 requests a minute, one item at a time: the first goes at once, the second a second later,
    the third would go at 2 s, past the 1.8 s batch deadline: it fails at once, never sent, never a
    0."""
    with LimitedOpenAI() as server:
        limit = {"requests_per_minute": 60}
        params = {**JUDGE, "base_url": server.base_url, "endpoint_limit": limit, "concurrency": 1}
        request = RewardRequest(items=[RewardItem(id=f"i{n}", text="x") for n in range(3)])
        with LocalRewardBackend("llm_judge", params={**params, "batch_timeout_s": 1.8}) as judge:
            with pytest.raises(ScorerItemsFailed) as info:
                judge.compute_rewards(request)
    name = f"127.0.0.1:{server.url.rsplit(':', 1)[1]}/v1"
    message = str(info.value)
    assert f"'i2': endpoint limit: endpoint {name!r}: its requests/min (60 requests/min)" in message
    assert "'i0'" not in message and "'i1'" not in message and len(server.arrivals) == 2
    values = info.value.partial.diagnostics["llm_judge"]["values"]
    assert values["limit_waits"] >= 1 and values["attempts"] == 2


def test_tokens_are_estimated_before_and_reconciled_from_usage_after():
    """A bucket of 10 tokens a second: an estimate past it is taken into debt; the answer's usage
    gives back what was over-estimated. The judge's estimate (body / 4 + max_tokens, over 40) with
    an answer of 5 tokens leaves the bucket at 5 or more, where the estimate alone leaves a debt."""
    limit = EndpointLimit("tokens", tokens_per_minute=600)
    levels = Levels.full(limit, now=100.0)
    assert levels.wait_for(limit, 30, now=100.0)[0] == 0
    levels.take(limit, 30)
    assert levels.tok == -20 and levels.wait_for(limit, 30, now=100.0) == (3.0, "tokens/min")
    levels.give_back(limit, 30 - 5, now=100.5)
    assert levels.tok == 10  # -20 + 0.5 s x 10/s + 25, at most the bucket
    with LimitedOpenAI(usage_tokens=5) as server:
        judge = LlmJudge(
            **{**JUDGE, "base_url": server.base_url, "max_tokens": 8},
            endpoint_limit={"tokens_per_minute": 600},
        )
        judge.load()
        assert judge.endpoint_limit is not None
        watcher = LocalLimiter(judge.endpoint_limit)
        try:
            assert judge.score([ScoreItem(id="a", text="x")]).terms["llm_judge"] == [0.7]
            assert watcher.levels().tok >= 5, watcher.levels()
        finally:
            watcher.close()
            judge.close()


def test_the_limit_is_not_identity_and_bad_limits_are_refused():
    with LimitedOpenAI() as server:
        params = {**JUDGE, "base_url": server.base_url}
        plain = LocalRewardBackend("llm_judge", params=params)
        limited = {**params, "endpoint_limit": {"concurrency": 2}}
        assert LocalRewardBackend("llm_judge", params=limited).identity_hash == plain.identity_hash
    for bad, message in (
        ({}, "give at least one of"),
        ({"concurrency": 0}, "concurrency must be a positive int"),
        ({"rpm": 5}, "unknown keys \\['rpm'\\]"),
        ({"requests_per_minute": 5, "adaptive": True}, "adaptive needs concurrency"),
    ):
        with pytest.raises(ValueError, match=message):
            LlmJudge(**{**JUDGE, "base_url": "http://127.0.0.1:9/v1"}, endpoint_limit=bad)


def test_one_declaration_per_endpoint_while_it_has_users():
    first = LocalLimiter(EndpointLimit("judge", requests_per_minute=60))
    try:
        with pytest.raises(LimitConflict, match="other processes on this node declared"):
            LocalLimiter(EndpointLimit("judge", requests_per_minute=120))
        LocalLimiter(EndpointLimit("judge", requests_per_minute=60)).close()
    finally:
        first.close()
    LocalLimiter(EndpointLimit("judge", requests_per_minute=120)).close()  # no user left


def test_another_user_can_reach_no_limit(limits_dir):
    """The directory must be this user's and closed to others: a group- or world-open directory,
    or one another uid owns, is refused naming it (another user could set our limits)."""
    limits_dir.mkdir(mode=0o700)
    os.chmod(limits_dir, 0o755)
    with pytest.raises(LimitStateError, match="has mode 755; it must be 700"):
        LocalLimiter(EndpointLimit("judge", concurrency=1))
    os.chmod(limits_dir, 0o700)
    if os.getuid() == 0:
        os.chown(limits_dir, 65534, 65534)
        with pytest.raises(LimitStateError, match="belongs to uid 65534, not to this user"):
            LocalLimiter(EndpointLimit("judge", concurrency=1))


def test_the_adaptive_window_halves_on_429s_and_latency_and_grows_back():
    """An endpoint that takes 3 at once (429 past them) and slows with load: the window, declared
    12, slow-starts from 4, is cut to a few; once the endpoint has room (no limit, latency flat),
    it grows back (within 400 answers: on a busy machine a late answer is a spike and cuts)."""
    with LimitedOpenAI(concurrency=3, base_s=0.05, per_load_s=0.05) as server:
        limit = {"concurrency": 12, "adaptive": True}
        judge = LlmJudge(
            **{**JUDGE, "base_url": server.base_url, "concurrency": 12, "max_attempts": 20},
            endpoint_limit=limit,
        )
        judge.load()
        assert judge.endpoint_limit is not None
        watcher = LocalLimiter(judge.endpoint_limit)
        try:
            assert watcher.levels().window == 4  # slow start
            crowded = judge.score([ScoreItem(id=f"a{n}", text="x") for n in range(24)])
            shrunk = watcher.levels().window
            server.concurrency, server.base_s, server.per_load_s = None, 0.08, 0.0
            for batch in range(4):  # a loaded machine's slow answer is a spike: it cuts, rightly
                judge.score([ScoreItem(id=f"b{batch}.{n}", text="x") for n in range(100)])
                grown = watcher.levels().window
                if grown >= shrunk + 4:
                    break
        finally:
            watcher.close()
            judge.close()
    assert crowded.terms["llm_judge"] == [0.7] * 24 and server.throttled > 0
    assert shrunk <= 6 and grown >= shrunk + 4, (shrunk, grown)


def test_the_window_rule():
    """The adaptive window (scorers.limits.window): slow start from 4 while used, a cut to 0.7 on a
    throttle or a spike (once per base latency) remembered as the ceiling, growth of 1/window per
    good answer only while the window is used, PROBE times slower near the ceiling, and a refused
    probe (near the ceiling after a quiet spell) a step back of one."""
    levels = Levels.full(EndpointLimit("w", concurrency=8, adaptive=True), now=0.0)
    assert levels.window == 4.0
    window.answered(levels, 8, latency_s=0.1, now=1.0)
    assert (levels.window, levels.base_s) == (4.0, 0.1)  # not used lately: no growth
    window.filled(levels, now=1.0)
    window.answered(levels, 8, latency_s=0.1, now=1.0)
    window.answered(levels, 8, latency_s=0.1, now=1.0)
    assert levels.window == 6.0  # slow start: one per answer
    window.cut(levels, now=1.0)
    window.cut(levels, now=1.05)  # within one base latency of the last cut: the same burst
    assert levels.window == pytest.approx(4.2) and levels.ceiling == 6.0
    window.answered(levels, 8, latency_s=0.25, now=1.2)  # a spike
    assert levels.window == pytest.approx(2.94) and levels.ceiling == pytest.approx(4.2)
    window.filled(levels, now=2.0)
    window.answered(levels, 8, latency_s=0.1, now=2.0)
    assert levels.window == pytest.approx(2.94 + 1 / 2.94)  # far from the ceiling: 1/window
    levels.window = 4.0
    window.answered(levels, 8, latency_s=0.1, now=2.0)
    assert levels.window == pytest.approx(4.0 + 1 / (4.0 * window.PROBE))  # near it: slower
    levels.window, levels.ceiling = 5.0, 5.0
    window.cut(levels, now=9.0)  # a probe refused after a quiet spell
    assert (levels.window, levels.ceiling) == (4.0, 5.0) and window.usable(levels) == 4


def test_a_shrunk_window_counts_the_calls_still_in_slots_past_it(tmp_path):
    """Three calls in flight when the window shrinks to 2: none begins until only one is left,
    whichever slots they hold."""
    slots = Slots(tmp_path / "shrunk", 8)
    held = [slots.try_take(8) for _ in range(3)]
    assert None not in held
    assert slots.try_take_counted(2) is None
    slots.give(held.pop())
    assert slots.try_take_counted(2) is None
    slots.give(held.pop())
    taken = slots.try_take_counted(2)
    assert taken is not None and taken < 2
    for index in (taken, *held):
        slots.give(index)


def test_a_lease_still_in_flight_at_close_ends_on_the_files_it_began_on():
    """A call past its batch's deadline may end after the judge closed: its lease still gives its
    slot and its tokens back; a new lease after close is refused."""
    limiter = LocalLimiter(EndpointLimit("late", tokens_per_minute=600, concurrency=1))
    lease = limiter.acquire(10, time.monotonic() + 5)
    limiter.close()
    lease.end(tokens_used=1, latency_s=0.1)
    with pytest.raises(LimitError, match="the limiter is closed"):
        limiter.acquire(1, time.monotonic() + 5)
    again = LocalLimiter(EndpointLimit("late", tokens_per_minute=600, concurrency=1))
    try:
        assert again.levels().tok >= 9  # 10 - 10 + 9 given back
        again.acquire(1, time.monotonic() + 1).end()  # the slot is free
    finally:
        again.close()


def test_a_caller_that_waited_for_the_record_never_winds_the_buckets_clock_back():
    """The time a caller reads before it waits for the record's lock is stale once it has it:
    refilling with it wound the buckets' clock back, and the next refill credited that interval
    again (512 ranks on 2 cores began 531 requests in a second where the bucket allows 400:
    `python -m bench --only endpoint_sim`). The record's clock only moves forward."""
    limit = EndpointLimit("clock", requests_per_minute=60)
    holder, caller = LocalLimiter(limit), LocalLimiter(limit)
    try:
        caller.acquire(1, time.monotonic() + 5).end()  # the bucket of one is empty now
        waiting = threading.Thread(
            target=lambda: caller.acquire(1, time.monotonic() + 30).end(), name="waiting-caller"
        )
        with holder._ledger.locked() as record:
            assert record.levels is not None
            waiting.start()
            time.sleep(0.3)  # the caller reads the time, then waits for this lock
            record.levels.refill(limit, time.monotonic())
            refilled_at = record.levels.t
        seen: list[Levels] = []
        assert eventually(lambda: seen.append(_raw_levels(holder)) or seen[-1].req < 0)
        assert seen[-1].t >= refilled_at, (seen[-1], refilled_at)  # the caller's reservation
        waiting.join(30)
        assert not waiting.is_alive()
    finally:
        holder.close()
        caller.close()


def _raw_levels(limiter: LocalLimiter) -> Levels:
    """The record's levels as written (`levels()` refills them to now first)."""
    with limiter._ledger.locked() as record:
        assert record.levels is not None
        return replace(record.levels)


@pytest.mark.slow
def test_a_managed_judge_child_shares_the_limit_with_its_trainer(managed):
    """The trainer's process holds the endpoint's one slot: a managed judge child (envs/image)
    waits for it and fails its item at its deadline, naming the trainer's pid; freed, it judges."""
    limit = {"name": "shared-judge", "concurrency": 1}
    with LimitedOpenAI() as server:
        params = {**JUDGE, "base_url": server.base_url, "endpoint_limit": limit}
        child = managed(env_python("image"), "llm_judge", params={**params, "batch_timeout_s": 1})
        request = RewardRequest(items=[RewardItem(id="a", text="x")])
        trainer = LocalLimiter(EndpointLimit("shared-judge", concurrency=1))
        try:
            lease = trainer.acquire(1, time.monotonic() + 5)
            with pytest.raises(ScorerItemsFailed, match=f"concurrency .* pids \\[{os.getpid()}\\]"):
                child.compute_rewards(request)
            lease.end()
            assert child.compute_rewards(request).rewards == [0.7]
        finally:
            trainer.close()
    assert len(server.arrivals) == 1
