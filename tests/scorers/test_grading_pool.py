"""GradingPool with real forkserver workers: order, timeouts, crashes, teardown."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from scorers.grading import mp_helpers
from scorers.grading.errors import GradingPoolError, GradingTaskError
from scorers.grading.outcomes import GradeOutcome
from scorers.grading.pool import GradingPool
from supervisor.fanout import on_each
from tests.conftest import eventually
from tests.helpers.grading_fixtures import multiprocessing_helpers, wait_gone

REPO = Path(__file__).resolve().parents[2]
FIXTURES = "tests.helpers.grading_fixtures"
# kill + reap + replacement on top of a timeout, on a loaded 2-core box. Each bound it sets proves a
# deadline was kept against a task that would run 30-60 s (or minutes in C) without it: generous,
# never a speed
SLACK_S = 5.0
# workers fork from the forkserver (warm_replay=0) or from the pool's template (as the math scorer's
# do)
FORKED_FROM = pytest.mark.parametrize("replay", [0, 4], ids=["forkserver", "template"])


@pytest.fixture
def make_pool():
    """Build (and by default start) pools on a fixtures function; close them all afterwards."""
    pools: list[GradingPool] = []

    def factory(
        fn: str, jobs: int = 2, timeout_s: float = 10.0, start: bool = True, **options: Any
    ) -> GradingPool:
        pool = GradingPool(jobs, timeout_s, f"{FIXTURES}:{fn}", **options)
        pools.append(pool)
        if start:
            pool.start()
        return pool

    yield factory
    for pool in pools:
        pool.close()


def test_workers_fork_from_a_frozen_heap(make_pool):
    """The forkserver freezes what its preload built, so no worker's full collection walks it (a
    math_verify worker's would take 50-60 ms, in the middle of some item)."""
    pool = make_pool("frozen_objects", jobs=1)
    # the interpreter's own objects and the preloaded modules'
    assert pool.grade([()])[0].value > 10_000


def test_last_close_stops_only_the_helpers_pools_launched(make_pool):
    first = make_pool("square", jobs=1)
    helpers = [p.pid for p in multiprocessing_helpers()]
    second = make_pool("square", jobs=1)
    assert [p.pid for p in multiprocessing_helpers()] == helpers  # one forkserver per process
    first.close()
    assert second.grade([(4,)])[0].value == 16  # still served: the helpers stay for `second`
    second.close()
    assert not wait_gone(helpers, 5.0)


def test_results_come_back_in_task_order(make_pool):
    pool = make_pool("square")
    outcomes = pool.grade([(i,) for i in range(25)])
    assert [o.value for o in outcomes] == [i * i for i in range(25)]
    assert all(o.status == "ok" and o.elapsed_s >= 0 for o in outcomes)
    assert pool.grade([]) == []


def test_multiple_positional_args(make_pool):
    pool = make_pool("echo", jobs=1)
    assert pool.grade([("a", 1, None), ()]) == [
        GradeOutcome("ok", ("a", 1, None), pytest.approx(0, abs=60)),
        GradeOutcome("ok", (), pytest.approx(0, abs=60)),
    ]


def test_construction_is_cheap_and_validated(make_pool):
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    pool = make_pool("square", start=False)
    assert pool.worker_pids() == []
    assert {p.pid for p in psutil.Process().children(recursive=True)} == before
    with pytest.raises(ValueError):
        GradingPool(0, 1.0, f"{FIXTURES}:square")
    with pytest.raises(ValueError):
        GradingPool(1, 0.0, f"{FIXTURES}:square")
    with pytest.raises(ValueError):
        GradingPool(1, float("inf"), f"{FIXTURES}:square")
    with pytest.raises(ValueError):
        GradingPool(1, 1.0, "no_colon.square")
    with pytest.raises(TypeError):
        GradingPool(1, 1.0, f"{FIXTURES}:square", preload="math_verify")


def test_grade_before_start_raises(make_pool):
    pool = make_pool("square", start=False)
    with pytest.raises(GradingPoolError, match="not started"):
        pool.grade([(1,)])


def test_second_start_raises(make_pool):
    pool = make_pool("square")
    with pytest.raises(GradingPoolError, match="twice"):
        pool.start()
    assert pool.grade([(3,)])[0].value == 9


def test_non_tuple_task_is_refused(make_pool):
    pool = make_pool("square", jobs=1)
    with pytest.raises(TypeError, match=r"tasks\[1\]"):
        pool.grade([(1,), 2])
    assert pool.grade([(2,)])[0].value == 4


def test_unknown_grade_fn_fails_start():
    pool = GradingPool(1, 5.0, f"{FIXTURES}:does_not_exist")
    try:
        with pytest.raises(GradingPoolError, match="does_not_exist"):
            pool.start()
        assert pool.worker_pids() == []
    finally:
        pool.close()


@pytest.mark.slow
def test_sleeping_item_times_out_while_neighbours_score(make_pool):
    timeout_s = 1.0
    pool = make_pool("sleep_for", jobs=2, timeout_s=timeout_s)
    pids_before = set(pool.worker_pids())
    # only "b" passes the soft deadline
    tasks = [(0.0, "a"), (60.0, "b"), (0.0, "c"), (0.02, "d"), (0.0, "e")]
    started = time.monotonic()
    outcomes = pool.grade(tasks)
    wall_s = time.monotonic() - started

    assert [o.status for o in outcomes] == ["ok", "timeout", "ok", "ok", "ok"]
    assert [o.value for o in outcomes] == ["a", None, "c", "d", "e"]
    assert timeout_s <= outcomes[1].elapsed_s < timeout_s + SLACK_S
    assert wall_s < timeout_s + SLACK_S

    pids_after = set(pool.worker_pids())
    killed = pids_before - pids_after
    assert len(killed) == 1 and len(pids_after) == 2
    killed_pid = killed.pop()
    assert not wait_gone([killed_pid], 2.0), "the timed-out worker was not killed"
    assert [o.value for o in pool.grade([(0.0, i) for i in range(6)])] == list(range(6))
    # reaped, so forgotten: its pid may be the caller's next, and the set of the pool's stays
    # bounded
    assert (
        killed_pid not in mp_helpers._pool_children
        and set(pool.worker_pids()) <= mp_helpers._pool_children
    )


@pytest.mark.slow
def test_worker_stuck_in_c_code_is_killed(make_pool):
    timeout_s = 1.0
    pool = make_pool("busy_loop_in_c", jobs=1, timeout_s=timeout_s)
    (old_pid,) = pool.worker_pids()
    started = time.monotonic()
    (outcome,) = pool.grade([()])
    assert outcome.status == "timeout" and outcome.value is None
    assert time.monotonic() - started < timeout_s + SLACK_S
    assert not wait_gone([old_pid], 2.0)
    assert pool.worker_pids() != [old_pid] and len(pool.worker_pids()) == 1


@FORKED_FROM
def test_worker_exit_raises_and_breaks_the_pool(make_pool, replay):
    pool = make_pool("crash_if", jobs=2, warm_replay=replay)
    pids = pool.worker_pids()
    with pytest.raises(GradingPoolError) as caught:
        pool.grade([("a",), ("crash",), ("b",)])
    message = str(caught.value)
    assert not isinstance(caught.value, GradingTaskError)
    pid = int(re.search(r"pid (\d+)", message).group(1))
    assert pid in pids
    assert "exit 7" in message and "task 1" in message
    assert pool.worker_pids() == []
    assert not wait_gone(pids, 5.0)

    with pytest.raises(GradingPoolError, match="broken") as again:
        pool.grade([("a",)])
    assert "exit 7" in str(again.value)
    assert pool.worker_pids() == []  # refused from its record: no worker was started to find out


@FORKED_FROM
def test_worker_killed_by_signal_names_the_signal(make_pool, replay):
    pool = make_pool("kill_self", jobs=1, warm_replay=replay)
    (pid,) = pool.worker_pids()
    with pytest.raises(GradingPoolError, match=rf"pid {pid}.*task 0.*SIGKILL"):
        pool.grade([()])


def test_grade_fn_exception_carries_the_remote_error(make_pool):
    pool = make_pool("fail_if", jobs=2)
    with pytest.raises(GradingTaskError) as caught:
        pool.grade([("ok",), ("bad",), ("fine",)])
    error = caught.value
    assert isinstance(error, GradingPoolError)
    assert error.task_index == 1 and error.remote_type == "ValueError"
    assert "ValueError: refusing 'bad'" in str(error) and "task 1" in str(error)
    # A task error is the task's fault: the pool keeps serving.
    assert [o.value for o in pool.grade([("x",), ("y",), ("z",)])] == ["x", "y", "z"]
    assert len(pool.worker_pids()) == 2


def test_unpicklable_result_is_a_task_error(make_pool):
    pool = make_pool("unpicklable_result", jobs=1)
    with pytest.raises(GradingTaskError, match="could not be sent"):
        pool.grade([()])


@FORKED_FROM
def test_close_leaves_no_worker_alive_and_is_idempotent(make_pool, replay):
    pool = make_pool("square", jobs=2, warm_replay=replay)
    pool.grade([(1,), (2,)])
    pids = pool.worker_pids() + pool.spare_pids() + ([pool.template_pid()] if replay else [])
    helpers = [p.pid for p in multiprocessing_helpers()]
    assert len(pids) == 3 + bool(replay) and all(psutil.pid_exists(pid) for pid in pids)
    assert len(helpers) == 2  # forkserver + resource tracker, launched for this pool
    started = time.monotonic()
    pool.close()
    pool.close()
    assert time.monotonic() - started < 10.0  # bounded (a reap per process at most REAP_TIMEOUT_S)
    assert not wait_gone(pids + helpers, 5.0)
    assert pool.worker_pids() == []
    with pytest.raises(GradingPoolError, match="closed"):
        pool.grade([(1,)])


@pytest.mark.slow
def test_batch_cap_raises_and_breaks_the_pool(make_pool):
    pool = make_pool("sleep_for", jobs=1, timeout_s=1.0)
    pool._tasks.batch_slack_s = -2.5  # cap = 3 * 1 * 1 - 2.5 = 0.5 s, below the item timeout
    pids = pool.worker_pids()
    started = time.monotonic()
    with pytest.raises(GradingPoolError, match="exceeded its deadline"):
        pool.grade([(30.0,)])
    assert time.monotonic() - started < 0.5 + SLACK_S
    assert not wait_gone(pids, 5.0)
    with pytest.raises(GradingPoolError, match="broken"):
        pool.grade([(0.0,)])


OWNER_SCRIPT = textwrap.dedent(
    """
    import sys
    from scorers.grading.pool import GradingPool


    def main():
        pool = GradingPool(
            2,
            300.0,
            "tests.helpers.grading_fixtures:touch_then_sleep",
            warm_replay=int(sys.argv[2]),
        )
        pool.start()
        # the first tasks pass the soft deadline: their workers are held back (stopped) in overflow
        pool.grade([(sys.argv[1] + ".a", 300.0), (sys.argv[1] + ".b", 300.0), (sys.argv[1], 300.0)])


    if __name__ == "__main__":
        main()
    """
)


@pytest.mark.slow
@FORKED_FROM
def test_sigkill_of_the_owner_takes_forkserver_and_workers_down(tmp_path, replay):
    script, marker = tmp_path / "owner.py", tmp_path / "started"
    script.write_text(OWNER_SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    owner = subprocess.Popen(
        [sys.executable, str(script), str(marker), str(replay)], cwd=REPO, env=env
    )
    family: list[int] = []
    try:
        deadline = time.monotonic() + 60.0
        while not marker.exists() and owner.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert marker.exists(), f"owner never started grading (exit {owner.poll()})"
        busy_pid = int(marker.read_text())
        family = [p.pid for p in psutil.Process(owner.pid).children(recursive=True)]
        held = [int(Path(f"{marker}.{x}").read_text()) for x in "ab"]
        assert {psutil.Process(pid).status() for pid in held} == {psutil.STATUS_STOPPED}
        # the helpers, the template if any, the 3 workers holding tasks and at least one more
        assert busy_pid in family and set(held) <= set(family) and len(family) >= 6 + bool(replay)
    finally:
        owner.send_signal(signal.SIGKILL)
        owner.wait(10)
    survivors = wait_gone(family, 10.0)
    assert not survivors, f"outlived their SIGKILLed owner: {survivors}"


def test_workers_die_with_the_forkserver(make_pool):
    pool = make_pool("square", jobs=2)
    pids = pool.worker_pids()
    (forkserver,) = [p for p in multiprocessing_helpers() if "forkserver" in " ".join(p.cmdline())]
    forkserver.kill()
    assert not wait_gone(pids, 5.0), "PR_SET_PDEATHSIG did not take the workers down"
    with pytest.raises(GradingPoolError, match=r"grading worker pid \d+ .*(255|SIGKILL)"):
        pool.grade([(1,)])
    assert pool.worker_pids() == []


# -- slow tasks leave their slots; bounds on memory and CPU time -------------------------------
@pytest.mark.slow
def test_a_slow_task_leaves_its_slot_and_its_clock_stops_while_ordinary_tasks_run(make_pool):
    """jobs=1: the slow task (0.3 s of CPU) is held back at the soft deadline while 40 ordinary
    tasks (4 s of waiting) take its slot; it then runs to completion: held-back time never counts
    against its 3 s. The ordinary tasks wait rather than compute, so that a loaded machine stretches
    neither them past WAIT_FACTOR soft deadlines nor the slow task's remaining 0.2 s of CPU past its
    3 s."""
    pool = make_pool("spin_then_sleep", jobs=1, timeout_s=3.0, soft_timeout_s=0.1)
    (first,) = pool.worker_pids()
    outcomes = pool.grade([(0.3, 0.0, "slow"), *[(0.0, 0.1, n) for n in range(40)]])
    slow, ordinary = outcomes[0], outcomes[1:]
    assert slow.status == "ok" and slow.value == "slow" and slow.overflowed
    # wall time from its start: more than its timeout, yet not timed out
    assert slow.elapsed_s > 4.0
    assert [o.value for o in ordinary] == list(range(40)) and not any(
        o.overflowed for o in ordinary
    )
    # retired after its task; slot refilled
    assert not wait_gone([first], 2.0) and len(pool.worker_pids()) == 1


@pytest.mark.slow
def test_the_soft_deadline_counts_cpu_time_so_a_busy_machine_moves_no_ordinary_task(
    make_pool, monkeypatch
):
    """The worker shares one CPU with three spinning processes: a task of 0.05 s CPU takes about
    four times that in wall time, past the 0.1 s soft deadline, yet keeps its slot; a task of 0.3 s
    CPU moves. The wait rule (a task holding its slot WAIT_FACTOR soft deadlines moves, whatever its
    CPU time: its own test below) is set out of reach, so that a machine loaded beyond the three
    spinners cannot move the short task by it: only the CPU rule is under test here."""
    from scorers.grading import tasks

    monkeypatch.setattr(tasks, "WAIT_FACTOR", 10_000)
    pool = make_pool("spin", jobs=1, timeout_s=10.0, soft_timeout_s=0.1)
    (worker,) = pool.worker_pids()
    cpu = sorted(os.sched_getaffinity(0))[0]
    hog = (
        "import os, sys; os.sched_setaffinity(0, {int(sys.argv[1])}); print(flush=True)\nwhile "
        "True: pass"
    )
    hogs = [
        subprocess.Popen([sys.executable, "-c", hog, str(cpu)], stdout=subprocess.PIPE)
        for _ in range(3)
    ]
    try:
        for process in hogs:
            # pinned, spinning
            assert process.stdout is not None and process.stdout.readline() == b"\n"
        os.sched_setaffinity(worker, {cpu})
        short, long_ = pool.grade([(0.05, "short"), (0.3, "long")])
    finally:
        for process in hogs:
            process.kill()
            process.wait(5)
    # starved, not slow
    assert short.status == "ok" and not short.overflowed and short.elapsed_s > 0.1
    assert long_.status == "ok" and long_.overflowed


@pytest.mark.slow
def test_a_task_that_waits_moves_once_it_held_its_slot_for_wait_factor_soft_deadlines(make_pool):
    from scorers.grading.config import WAIT_FACTOR

    pool = make_pool("sleep_for", jobs=1, timeout_s=10.0, soft_timeout_s=0.1)
    brief, waits = pool.grade(
        [(0.1 * WAIT_FACTOR / 2, "brief"), (30.0, "waits"), *[(0.0, n) for n in range(5)]]
    )[:2]
    # waited past 0.1 s, under 0.4 s: kept its slot
    assert brief.status == "ok" and not brief.overflowed
    assert waits.status == "timeout" and waits.overflowed


@pytest.mark.slow
def test_a_slow_task_is_killed_at_its_own_timeout_in_overflow(make_pool):
    pool = make_pool("sleep_for", jobs=2, timeout_s=1.0)
    pids = set(pool.worker_pids())
    outcomes = pool.grade([(60.0, "stuck"), *[(0.01, n) for n in range(20)]])
    assert (
        outcomes[0].status == "timeout"
        and outcomes[0].overflowed
        and 1.0 <= outcomes[0].elapsed_s < 1.0 + SLACK_S
    )
    assert [o.value for o in outcomes[1:]] == list(range(20))
    assert len(pool.worker_pids()) == 2 and not wait_gone(list(pids - set(pool.worker_pids())), 5.0)


@pytest.mark.slow
def test_overflow_is_bounded_past_it_a_slow_task_keeps_its_slot(make_pool):
    pool = make_pool("spin", jobs=1, timeout_s=1.0, overflow=1)
    outcomes = pool.grade([(30.0, "a"), (30.0, "b"), (0.0, "c")])
    assert [(o.status, o.overflowed) for o in outcomes] == [
        ("timeout", True),
        ("timeout", False),
        ("ok", False),
    ]


def test_overflow_zero_never_moves_a_task_and_bad_options_are_refused(make_pool):
    pool = make_pool("sleep_for", jobs=1, timeout_s=0.6, overflow=0)
    (outcome,) = pool.grade([(0.4, "x")])
    assert outcome.status == "ok" and not outcome.overflowed
    for options, message in (
        ({"soft_timeout_s": 0.6}, "soft_timeout_s must be > 0 and below timeout_s"),
        ({"overflow": -1}, "overflow must be an int >= 0"),
        ({"memory_cap_bytes": 10}, "memory_cap_bytes must be an int >= 1 MiB"),
    ):
        with pytest.raises(ValueError, match=message):
            GradingPool(1, 0.6, f"{FIXTURES}:square", **options)


@FORKED_FROM
def test_a_memory_bomb_is_its_own_outcome_and_the_pool_keeps_serving(make_pool, replay):
    pool = make_pool("allocate", jobs=1, memory_cap_bytes=256 * 2**20, warm_replay=replay)
    (before,) = pool.worker_pids()
    bomb, small = pool.grade([(4096,), (16,)])
    assert bomb.status == "memory" and bomb.value is None
    assert small.status == "ok" and small.value == 16 * 2**20
    # the bombed worker exited, replaced
    assert before not in pool.worker_pids() and not wait_gone([before], 2.0)


def test_a_memory_error_the_grader_caught_is_still_seen(make_pool):
    """math_verify catches MemoryError and answers 0: a worker whose address space reached the cap
    reports the task as over the cap anyway."""
    pool = make_pool("allocate_caught", jobs=1, memory_cap_bytes=128 * 2**20)
    bomb, small = pool.grade([(4096,), (16,)])
    assert (bomb.status, small.status, small.value) == ("memory", "ok", 1.0)


@FORKED_FROM
def test_the_cpu_time_cap_is_its_own_outcome(make_pool, replay):
    pool = make_pool("cpu_limit_signal", jobs=1, warm_replay=replay)
    (outcome,) = pool.grade([()])
    assert outcome.status == "cpu" and len(pool.worker_pids()) == 1


def test_the_cpu_time_cap_is_set_by_the_kernel_per_task():
    script = (
        "import time\nfrom scorers.grading.worker import cap_cpu\ncap_cpu(0.5)\nwhile "
        "True:\n    pass\n"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, timeout=30)
    assert done.returncode == -signal.SIGXCPU


def test_a_worker_that_grew_is_replaced_so_memory_returns(make_pool):
    pool = make_pool("leak", jobs=2)
    before = pool.worker_pids()
    rss_before = sum(psutil.Process(pid).memory_info().rss for pid in before)
    assert [o.value for o in pool.grade([(8,), (200,)])] == [8, 200]
    after = pool.worker_pids()
    assert len(set(before) - set(after)) == 1  # only the one that grew past the threshold
    rss_after = sum(psutil.Process(pid).memory_info().rss for pid in after)
    assert rss_after < rss_before + 64 * 2**20, (rss_before, rss_after)


@FORKED_FROM
def test_a_spare_takes_the_slot_of_a_task_moved_to_overflow(make_pool, replay):
    pool = make_pool("sleep_for", jobs=1, timeout_s=1.0, warm_replay=replay)
    (spare,) = pool.spare_pids()
    outcomes = pool.grade([(30.0, "stuck"), (0.0, "next")])
    assert [o.status for o in outcomes] == ["timeout", "ok"]
    assert (
        pool.worker_pids() == [spare]
        and len(pool.spare_pids()) == 1
        and pool.spare_pids() != [spare]
    )
    # nothing ever moves: no spare
    assert make_pool("square", jobs=1, overflow=0).spare_pids() == []


# -- the template: workers fork warm ------------------------------------------------------------
def parent_of(pid: int) -> int:
    return psutil.Process(pid).ppid()


@pytest.mark.parametrize("replay", [0, 4])
def test_a_worker_forked_after_a_batch_starts_with_what_the_template_replayed(make_pool, replay):
    """A grader's caches (here: which values it has seen) reach a worker started after the batch, as
    if it had graded the batch itself; without the template it starts empty."""
    pool = make_pool("remember", jobs=1, warm_replay=replay)
    if replay:
        (forkserver,) = [
            p.pid for p in multiprocessing_helpers() if "forkserver" in " ".join(p.cmdline())
        ]
        assert parent_of(pool.template_pid()) == forkserver
        assert {parent_of(pid) for pid in pool.worker_pids() + pool.spare_pids()} == {
            pool.template_pid()
        }
    else:
        assert pool.template_pid() is None
    assert [o.value for o in pool.grade([(n,) for n in range(4)])] == [False] * 4
    assert pool.settle(10.0)
    (veteran,) = pool.worker_pids()
    # as after a memory bomb: the slot is refilled by a fresh fork
    pool._workers.retire(pool._workers.workers[0])
    (fresh,) = pool.worker_pids()
    assert fresh != veteran
    assert [o.value for o in pool.grade([(n,) for n in range(4)])] == [bool(replay)] * 4


def test_the_template_stops_replaying_when_a_batch_starts(make_pool):
    """Replays use idle cores only: the next batch halts them after the task in hand."""
    pool = make_pool("spin", jobs=1, warm_replay=40)
    template = psutil.Process(pool.template_pid())
    pool.grade([(0.05, n) for n in range(40)])  # the template now replays 40 x 0.05 s of CPU
    idle = cpu_s(template)
    assert eventually(lambda: cpu_s(template) - idle > 0.1, 5.0), (
        "the template did not replay while the pool was idle"
    )
    before = cpu_s(template)
    pool.grade([(0.05, n) for n in range(20)])  # 1 s of CPU on the worker
    used = cpu_s(template) - before
    assert used < 0.3, f"the template kept replaying during the batch ({used:.2f} CPU-s)"
    assert pool.settle(10.0)  # the halted request was answered; the next one is done too


def test_batches_back_to_back_never_start_a_replay_between_them(make_pool):
    """A replay waits until the pool has stayed idle (REPLAY_IDLE_S): a stream's windows sent back
    to back keep both cores (no replay, no halt, no collection between two batches)."""
    pool = make_pool("spin", jobs=1, warm_replay=40)
    template = psutil.Process(pool.template_pid())
    before = cpu_s(template)
    for _ in range(10):  # each batch's replay would cost the template 0.05 s of CPU at once
        pool.grade([(0.05, n) for n in range(2)])
    assert cpu_s(template) - before < 0.1, "the template replayed between batches sent back to back"
    assert pool._workers.template.replayed == 0
    # idle now: the last batch's replay runs and pool._workers.template.replayed == 2
    assert pool.settle(10.0)


def cpu_s(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system


def test_the_template_is_left_with_no_cpu_time_cap_after_a_replay(make_pool):
    """The cap is set for each replay and lifted after it: every fork costs the template CPU time,
    and a leftover cap would kill it (SIGXCPU) a few thousand forks later."""
    pool = make_pool("square", jobs=1, warm_replay=4)
    pool.grade([(n,) for n in range(4)])
    assert pool.settle(10.0) and pool._workers.template.replayed == 4
    with open(f"/proc/{pool.template_pid()}/limits") as limits:
        (line,) = [line for line in limits if line.startswith("Max cpu time")]
    assert line.split()[3:5] == ["unlimited", "unlimited"], line


def test_the_template_dying_breaks_the_pool_with_its_name_and_leaves_nothing(make_pool):
    pool = make_pool("square", jobs=2, warm_replay=4)
    template, workers = pool.template_pid(), pool.worker_pids() + pool.spare_pids()
    os.kill(template, signal.SIGKILL)
    assert not wait_gone(workers, 5.0), "the template's workers outlived it"
    with pytest.raises(GradingPoolError, match=rf"grading template pid {template} .*SIGKILL"):
        pool.grade([(2,)])
    with pytest.raises(GradingPoolError, match="template"):
        pool.grade([(2,)])
    pool.close()
    assert not wait_gone([template, *workers], 5.0)


def test_a_template_its_replays_grew_stops_replaying(make_pool):
    """Every worker forked from the template starts as big as it is: replays stop once they grew it
    by MAX_GROWTH_BYTES (a grader whose caches leak)."""
    pool = make_pool("leak", jobs=1, warm_replay=4)
    template = psutil.Process(pool.template_pid())
    rss_before = template.memory_info().rss
    pool.grade([(30,), (30,), (30,)])
    assert pool.settle(10.0) and not pool._workers.template.can_warm
    grown = template.memory_info().rss - rss_before
    assert 64 * 2**20 < grown < 100 * 2**20, grown
    pool.grade([(30,)])
    # nothing replayed
    assert pool.settle(10.0) and template.memory_info().rss - rss_before < grown + 8 * 2**20


def test_a_replay_slower_than_its_task_was_is_dropped_and_the_template_replaced(
    make_pool, tmp_path
):
    """The template must stay free to fork: a replay past REPLAY_CPU_S is stopped. Stopped part way
    through the grader's code, the template may hold half-updated state, so before the next batch it
    is replaced, with every worker it forked."""
    pool = make_pool("fast_once", jobs=1, warm_replay=4)
    old_template = pool.template_pid()
    old_workers = pool.worker_pids() + pool.spare_pids()
    paths = [str(tmp_path / str(n)) for n in range(2)]
    assert [o.value for o in pool.grade([(p,) for p in paths])] == paths
    assert (
        pool.settle(30.0)
        and pool._workers.template.tainted
        and pool._workers.template.replayed == 1
    )  # the second never ran
    # dropped: the replay would spin 3 s of CPU (CPU time, which a loaded machine does not stretch)
    assert cpu_s(psutil.Process(old_template)) < 3.0
    assert [o.value for o in pool.grade([(paths[0] + "x",)])] == [paths[0] + "x"]
    assert pool.template_pid() != old_template and not wait_gone([old_template, *old_workers], 5.0)
    assert {parent_of(pid) for pid in pool.worker_pids() + pool.spare_pids()} == {
        pool.template_pid()
    }


def test_a_fork_asked_for_during_a_replay_is_served_between_two_replayed_tasks(make_pool):
    pool = make_pool("spin", jobs=1, warm_replay=40)
    template = psutil.Process(pool.template_pid())
    pool.grade([(0.05, n) for n in range(40)])  # the template now replays 40 x 0.05 s of CPU
    idle = cpu_s(template)
    assert eventually(lambda: cpu_s(template) - idle > 0.05, 5.0) and pool._workers.template.warming
    started = time.monotonic()
    # forks the replacement from the replaying template
    pool._workers.retire(pool._workers.workers[0])
    # not after the 40 replays (2 s of CPU): between two of them
    assert time.monotonic() - started < 1.5
    assert [o.value for o in pool.grade([(0.0, "after")])] == ["after"]


def _grade_from_threads(pool: GradingPool, batches: list[list[tuple]]) -> list[Any]:
    """Each batch graded by its own thread, all at once; each thread's outcomes or exception, in
    order."""
    return on_each(batches, pool.grade, "grader")


@FORKED_FROM
def test_batches_graded_from_several_threads_at_once_each_get_their_own_results(make_pool, replay):
    pool = make_pool("echo", jobs=2, warm_replay=replay)
    batches = [[(f"b{b}-{i}",) for i in range(30 + b)] for b in range(6)]
    results = _grade_from_threads(pool, batches)
    for batch, outcomes in zip(batches, results, strict=True):
        assert [o.value for o in outcomes] == batch


@pytest.mark.slow
def test_slow_tasks_of_concurrent_batches_share_one_timeout(make_pool):
    """Four batches at once, a stuck task in each: the four are held back together while every
    batch's ordinary tasks run, then time out together: about one timeout for all, not one per
    batch. Shown by when each ran (its batch's return, less its elapsed time), not by a wall time
    that load stretches: all four stuck tasks were running at one moment."""
    pool = make_pool("sleep_for", jobs=2, timeout_s=1.0)
    batches = [[(60.0, "stuck"), *[(0.01, n) for n in range(10)]] for _ in range(4)]
    results = on_each(batches, lambda batch: (pool.grade(batch), time.monotonic()), "grader")
    spans = []
    for outcomes, returned in results:
        assert outcomes[0].status == "timeout" and outcomes[0].overflowed
        assert [o.value for o in outcomes[1:]] == list(range(10))
        spans.append((returned - outcomes[0].elapsed_s, returned))  # the stuck task ends its batch
    # one after another: disjoint
    assert max(start for start, _ in spans) < min(end for _, end in spans), spans


def test_a_task_error_fails_only_its_own_batch(make_pool):
    pool = make_pool("echo_or_raise", jobs=2)
    results = _grade_from_threads(
        pool, [[(n,) for n in range(20)], [(0,), ("raise",), (2,)], [(7,)] * 15]
    )
    assert [o.value for o in results[0]] == list(range(20)) and [o.value for o in results[2]] == [
        7
    ] * 15
    assert isinstance(results[1], GradingTaskError) and results[1].task_index == 1
    assert pool.grade([(5,)])[0].value == 5 and not pool.broken


@pytest.mark.slow
def test_held_tasks_together_stay_within_the_pool_memory_budget(make_pool):
    """Four tasks of 150 MiB each wait long enough to move to overflow: under their own 512 MiB cap,
    600 MiB together. With a 200 MiB budget the three largest are killed ("budget"), the one that
    fits finishes."""
    pool = make_pool("hold_memory", jobs=2, timeout_s=10.0, memory_budget_bytes=200 * 2**20)
    outcomes = pool.grade([*[(150, 1.5) for _ in range(4)], *[(1, 0.0) for _ in range(6)]])
    held = outcomes[:4]
    assert sorted(o.status for o in held) == ["budget", "budget", "budget", "ok"], held
    assert all(o.overflowed for o in held) and all(o.status == "ok" for o in outcomes[4:])
    with pytest.raises(ValueError, match="memory_budget_bytes"):
        GradingPool(1, 1.0, f"{FIXTURES}:square", memory_budget_bytes=1024)


def test_a_batch_done_under_another_callers_drive_returns_without_waiting_for_that_callers_batch(
    make_pool, tmp_path
):
    """Two callers: a slow batch (one 2 s task) and a quick one submitted while the slow one drives.
    The quick one returns as soon as its tasks are done, not when the driver's own batch is."""
    import threading

    pool = make_pool("touch_then_sleep", jobs=2, timeout_s=10.0, overflow=0)
    started = tmp_path / "slow-started"
    slow = threading.Thread(target=pool.grade, args=([(str(started), 2.0)],))
    slow.start()
    assert eventually(started.exists, 10)  # the slow caller drives, its task running
    began = time.monotonic()
    quick = pool.grade([(str(tmp_path / f"quick-{n}"), 0.0) for n in range(4)])
    took = time.monotonic() - began
    slow.join(10)
    # the slow batch ends at 2 s
    assert [o.status for o in quick] == ["ok"] * 4 and took < 1.5, took


EARLY_SCRIPT = textwrap.dedent(
    """
    import json, psutil
    from tests.helpers.grading_fixtures import wait_gone
    from scorers.grading.mp_helpers import (
        forkserver_modules,
        forkserver_pid,
        start_forkserver_early,
    )
    from scorers.grading.pool import GradingPool

    if __name__ == "__main__":
        fn = "tests.helpers.grading_fixtures:square"
        start_forkserver_early(
            forkserver_modules([], fn)
        )  # returns at once: the preload runs meanwhile
        early = forkserver_pid()
        pool = GradingPool(1, 10.0, fn, warm_replay=0)
        pool.start()
        values = [o.value for o in pool.grade([(3,), (4,)])]
        parents = {psutil.Process(pid).ppid() for pid in pool.worker_pids() + pool.spare_pids()}
        pool.close()
        alive = wait_gone(
            [early], 5.0
        )  # while this process lives: only the pool's close can stop it
        print(
            json.dumps(
                {"early": early, "parents": sorted(parents), "values": values, "alive": alive}
            )
        )
    """
)


def test_a_forkserver_started_early_serves_the_pool_and_is_stopped_with_it(tmp_path):
    """A child starts its pool's forkserver before its own imports (scorers/early.py): the pool
    forks its workers from that one, owns it as if it had launched it, and stops it when it
    closes."""
    script = tmp_path / "early.py"
    script.write_text(EARLY_SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, str(script)], cwd=REPO, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.splitlines()[-1])
    assert report["values"] == [9, 16] and report["parents"] == [report["early"]]
    # owned: stopped at the pool's close, not left to the process's exit
    assert report["alive"] == []


def test_an_early_start_that_fails_is_said_and_skipped(capsys):
    """An optimisation only: the child goes on (load() starts the same helper and reports its
    failure)."""
    from scorers import early

    assert (
        early.early_args("math_verify") == ["--early", "math_verify"]
        and early.early_args("constant") == []
    )
    early.run_from_argv(["child_runtime", "--early", "no_such_scorer"])
    early.run_from_argv(["child_runtime"])  # nothing named: nothing runs
    assert capsys.readouterr().err.count("early start 'no_such_scorer' skipped: KeyError") == 1


UNWAITED_SCRIPT = textwrap.dedent(
    """
    import json, os, sys, threading, time
    from pathlib import Path
    import signal
    import psutil
    from scorers.grading.mp_helpers import forkserver_pid
    from scorers.grading.pool import GradingPool


    def ignores_sigint(pid):
        with open(f"/proc/{pid}/status") as status:
            mask = next(int(line.split()[1], 16) for line in status if line.startswith("SigIgn:"))
        return bool(mask & (1 << (signal.SIGINT - 1)))


    def say_sigint(conn):
        conn.send(signal.getsignal(signal.SIGINT) is signal.default_int_handler)


    if __name__ == "__main__":
        signal.signal(
            signal.SIGINT, signal.default_int_handler
        )  # what a terminal's trainer has (CI ignores it)
        gate = Path(os.environ["GRADING_GATE"])
        pool = GradingPool(
            1, 10.0, "tests.helpers.grading_fixtures:square", preload=["tests.helpers.grading_gate"]
        )
        pool.start(wait=False)  # returns with the forkserver's preload still held at the gate
        returned_gated = not gate.exists()
        graded = []
        caller = threading.Thread(
            target=lambda: graded.append([o.value for o in pool.grade([(3,), (4,)])])
        )
        caller.start()
        caller.join(0.3)
        waited = caller.is_alive() and not graded  # the first grade() waits for the workers
        began = time.monotonic()
        settled = pool.settle(0.3)  # bounded while the start holds the pool
        settle_bounded = not settled and time.monotonic() - began < 10.0  # the gate holds it 30 s
        # a terminal's ^C reaches the forkserver mid-preload: it ignores it, as it does once
        # preloaded
        server = forkserver_pid(ensure=False)
        until = time.monotonic() + 10
        while not ignores_sigint(server) and time.monotonic() < until:
            time.sleep(0.01)
        os.kill(server, signal.SIGINT)
        gate.touch()
        caller.join(30)
        # the trainer's own forkserver processes get its ^C handler, not the preload's ignore
        import multiprocessing

        mine, theirs = multiprocessing.Pipe()
        own = multiprocessing.get_context("forkserver").Process(target=say_sigint, args=(theirs,))
        own.start()
        own_sigint = mine.recv() if mine.poll(30) else None
        own.join(30)
        closing = GradingPool(1, 10.0, "tests.helpers.grading_fixtures:square")
        closing.start(wait=False)
        closing.close()  # at once: waits for its start, then kills what it started
        pool.close()
        left = [
            p.pid
            for p in psutil.Process().children(recursive=True)
            if p.is_running() and p.status() != "zombie"
        ]
        report = {
            "returned_gated": returned_gated,
            "waited": waited,
            "settle_bounded": settle_bounded,
        }
        print(json.dumps({**report, "own_sigint": own_sigint, "graded": graded, "left": left}))
    """
)


def test_a_pool_started_without_waiting_serves_its_first_grade_once_up_and_leaves_nothing(tmp_path):
    """start(wait=False), as the math scorer's load() does: it returns while the forkserver still
    preloads; the first grade() waits for the workers, then grades; settle() meanwhile keeps its
    bound; a ^C at the preloading forkserver does not kill it; a close() right after such a start
    leaves no process."""
    script = tmp_path / "unwaited.py"
    script.write_text(UNWAITED_SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(REPO), "GRADING_GATE": str(tmp_path / "gate")}
    done = subprocess.run(
        [sys.executable, str(script)], cwd=REPO, env=env, capture_output=True, text=True, timeout=90
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.splitlines()[-1])
    assert report == {
        "returned_gated": True, "waited": True, "settle_bounded": True, "own_sigint": True,
        "graded": [[9, 16]], "left": [],
    }  # fmt: skip


def test_a_start_not_waited_for_that_fails_is_the_first_grades_error(make_pool):
    pool = make_pool("no_such_function", jobs=1, start=False)
    pool.start(wait=False)
    with pytest.raises(
        GradingPoolError, match="cannot load 'tests.helpers.grading_fixtures:no_such_function'"
    ):
        pool.grade([(1,)])
    assert pool.broken
    with pytest.raises(GradingPoolError, match="broken: .*no_such_function"):
        pool.grade([(1,)])


# -- the forkserver is process-global: the pool's and the caller's -----------------------------
FORKSERVER_SCRIPT = textwrap.dedent(
    """
    import json, multiprocessing, os, sys
    from scorers.grading.mp_helpers import forkserver_pid
    from scorers.grading.pool import GradingPool
    from tests.helpers.grading_fixtures import sleep_for

    PRELOADED = "tests.helpers.grading_preloaded"


    def alive(pid):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True


    if __name__ == "__main__":
        ctx = multiprocessing.get_context("forkserver")
        pool = GradingPool(
            1, 10.0, "tests.helpers.grading_fixtures:preload_state", preload=[PRELOADED]
        )
        trainer_first = sys.argv[1] == "trainer-first"
        if trainer_first:  # the caller's own forkserver runs first, preloading its own modules
            ctx.set_forkserver_preload(["json"])
            own = ctx.Process(target=sleep_for, args=(2.0,))
            own.start()
            server = forkserver_pid(ensure=False)
            pool.start(wait=False)
        else:
            # the pool first, then the caller sets its preload at once, as bench.math_throughput did
            pool.start(wait=False)
            ctx.set_forkserver_preload(["json"])
            server = forkserver_pid(ensure=False)
            own = ctx.Process(
                target=sleep_for, args=(2.0,)
            )  # the caller forks from the pool's forkserver
            own.start()
        state = pool.grade([(PRELOADED,)])[0].value
        pool.close()
        own.join(30)
        again = ctx.Process(target=sleep_for, args=(0.0,))  # the caller's next process
        again.start()
        again.join(30)
        report = {"state": state, "own_exit": own.exitcode, "again_exit": again.exitcode}
        report["server_kept"] = alive(server) and forkserver_pid(ensure=False) == server
        print(json.dumps(report))
    """
)


@pytest.mark.parametrize("order", ["pool-first", "trainer-first"])
def test_workers_have_the_pools_preload_whoever_set_the_forkserver_and_the_callers_processes_survive(  # noqa: E501
    tmp_path, order
):
    """multiprocessing keeps one forkserver per process. pool-first: the caller's
    `set_forkserver_preload` right after `start(wait=False)` cannot make the pool's workers fork
    cold (it raced the start's thread); trainer-first: the workers fork from a template that ran the
    pool's preload, the caller's forkserver untouched. Either way the caller's own forkserver
    processes end with their own exit status, not 255, when the pool closes under them."""
    script = tmp_path / "forkserver.py"
    script.write_text(FORKSERVER_SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, str(script), order],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.splitlines()[-1])
    assert report["state"]["loaded"] == [True] and report["state"]["frozen"] > 1000, report
    assert report["own_exit"] == 0 and report["again_exit"] == 0, report
    if order == "trainer-first":
        assert report["server_kept"], report  # the caller's forkserver: never the pool's to stop
