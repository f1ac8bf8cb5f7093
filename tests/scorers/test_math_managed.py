"""math_verify in its own venv: isolation, timeouts, teardown and orphan safety."""

from __future__ import annotations

import importlib.metadata
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from supervisor import (
    LocalRewardBackend,
    RewardItem,
    RewardRequest,
    ScorerProcessDied,
    ScorerRequestError,
    ScorerTimeout,
)
from tests.conftest import REPO_ROOT, group_members, wait_in_flight, wait_until_gone

PERCENT = RewardItem(id="pct", text="So the rate is \\boxed{10\\%}.", reference="0.1")
TOWER = "\\boxed{9^{9^{9^{9}}}}"


def math_items() -> list[RewardItem]:
    return [
        RewardItem(id="right", text="Adding them gives \\boxed{2}.", reference="2"),
        RewardItem(id="frac", text="$\\frac{1}{2}$", reference={"answer": "0.5"}),
        RewardItem(id="tower", text=TOWER, reference="1"),
        RewardItem(id="wrong", text="\\boxed{3}", reference="2"),
        RewardItem(id="junk", text="banana", reference="7"),
        RewardItem(id="sqrt", text="\\boxed{\\sqrt{4}}", reference="2"),
    ]


@pytest.mark.slow
def test_isolation_fixes_the_antlr_conflict(managed, math_python):
    """Same run: trainer env has antlr 4.9.3 and grades 10% wrong; the child has 4.13.2 and grades
    it right."""
    assert importlib.metadata.version("antlr4-python3-runtime") == "4.9.3"
    assert importlib.metadata.version("hydra-core") == "1.3.2"
    backend = managed(math_python, "math_verify", params={"jobs": 1, "timeout_s": 10})
    packages = backend.health()["packages"]
    assert packages["antlr4-python3-runtime"] == "4.13.2" and packages["math-verify"] == "0.9.0"
    request = RewardRequest(items=[PERCENT])
    assert backend.compute_rewards(request).rewards == [1.0]
    with LocalRewardBackend("math_verify", params={"jobs": 1, "timeout_s": 10}) as local:
        assert local.compute_rewards(request).rewards == [0.0]  # the silent bug isolation removes


@pytest.mark.slow
def test_the_first_request_waits_for_the_grading_workers_past_a_short_request_timeout(
    managed, math_python
):
    """A math child says ready while its grading workers still start (about 0.5 s more here), so its
    first request gets what is left of the boot's start-up budget, not the 0.1 s request timeout a
    warm child is held to (which killed and restarted the child at every first call)."""
    backend = managed(
        math_python, "math_verify", params={"jobs": 1}, process={"request_timeout": 0.1}
    )
    assert backend.ready_info["warming"] is True
    began = time.monotonic()
    assert backend.compute_rewards(RewardRequest(items=[PERCENT])).rewards == [1.0]
    # it did wait past the request timeout
    assert time.monotonic() - began > 0.1 and backend.restarts == 0
    assert backend.compute_rewards(RewardRequest(items=[PERCENT])).rewards == [1.0]


@pytest.mark.slow
def test_an_error_answer_shows_the_child_warm_and_ends_the_first_requests_grace(
    managed, math_python
):
    """An input error is answered only once the workers are up (score() waits for their start
    first), so any answer shows the child warm: a child that hangs after it is killed at the 0.5 s
    request timeout, not at its start-up deadline (60 s here)."""
    backend = managed(
        math_python, "math_verify", params={"jobs": 1}, process={"request_timeout": 0.5}
    )
    no_gold = RewardItem(id="g", text="\\boxed{2}", reference={"answer": None})
    with pytest.raises(ScorerRequestError, match="needs a reference answer"):
        backend.compute_rewards(RewardRequest(items=[no_gold]))
    os.kill(backend.pid, signal.SIGSTOP)  # hung from here on
    began = time.monotonic()
    with pytest.raises(ScorerTimeout):
        backend.compute_rewards(RewardRequest(items=[PERCENT]))
    assert time.monotonic() - began < 10


@pytest.mark.slow
def test_a_grader_broken_at_import_fails_the_first_request_with_its_own_error(
    managed, math_python, tmp_path
):
    """math_verify present (find_spec passes at load) but raising at import: the preloading
    forkserver dies, and the first request's error says what the import raised, ahead of the child's
    log tail (which holds the forkserver's traceback too, but is cut to its last lines), not just an
    EOF."""
    fake = tmp_path / "fake" / "math_verify"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(
        'raise RuntimeError("math_verify broken at import: incompatible sympy")\n'
    )
    backend = managed(
        math_python,
        "math_verify",
        params={"jobs": 1},
        process={"extra_import_paths": [str(fake.parent), str(REPO_ROOT)]},
    )
    with pytest.raises(ScorerRequestError) as raised:
        backend.compute_rewards(RewardRequest(items=[PERCENT]))
    said = str(raised.value).split("--- log tail ---")[0]
    assert "the grading forkserver (pid" in said, said
    assert "RuntimeError: math_verify broken at import: incompatible sympy" in said, said


@pytest.mark.slow
def test_pathological_item_costs_its_timeout_only(managed, math_python):
    backend = managed(math_python, "math_verify", params={"jobs": 2, "timeout_s": 2})
    backend.compute_rewards(RewardRequest(items=[PERCENT]))  # warm the workers
    started = time.monotonic()
    response = backend.compute_rewards(RewardRequest(items=math_items()))
    elapsed = time.monotonic() - started
    assert elapsed < 2 + 2.5, f"batch took {elapsed:.2f} s with a 2 s per-item timeout"
    assert dict(zip(response.ids, response.rewards, strict=True)) == {
        "right": 1.0,
        "frac": 1.0,
        "tower": 0.0,
        "wrong": 0.0,
        "junk": 0.0,
        "sqrt": 1.0,
    }
    values = {
        "timeouts": 1,
        "memory_exceeded": 0,
        "cpu_exceeded": 0,
        "memory_budget_exceeded": 0,
        "overflowed": 1,
    }
    assert response.diagnostics["math_verify"] == {
        "sample_count": len(response.ids),
        "values": values,
    }
    assert backend.compute_rewards(RewardRequest(items=[PERCENT])).rewards == [1.0]


@pytest.mark.slow
def test_shutdown_takes_forkserver_and_workers(managed, math_python):
    backend = managed(math_python, "math_verify", params={"jobs": 2, "timeout_s": 5})
    backend.compute_rewards(RewardRequest(items=[PERCENT]))
    members = group_members(backend.pid)
    assert len(members) >= 4, f"expected child, forkserver and 2 workers, got {members}"
    # the forkserver was started before the child's own imports (scorers/early.py), and is the
    # child's
    assert psutil.Process(backend.pid).cmdline()[-2:] == ["--early", "math_verify"]
    # not skipped
    assert backend.log_path is not None and "early start" not in Path(backend.log_path).read_text()
    # text in, float64 scores out as stdlib arrays: the child never loads numpy (0.12 CPU-s of its
    # start)
    assert "_multiarray_umath" not in Path(f"/proc/{backend.pid}/maps").read_text()
    backend.close()
    assert backend._child.returncode() == 0
    assert wait_until_gone(members, 5) == []


@pytest.mark.slow
def test_kill_9_of_math_child_mid_batch_takes_its_descendants(managed, math_python):
    backend = managed(
        math_python,
        "math_verify",
        params={"jobs": 2, "timeout_s": 30},
        process={"request_timeout": 120},
    )
    backend.compute_rewards(RewardRequest(items=[PERCENT]))
    members = group_members(backend.pid)
    request = RewardRequest(
        items=[RewardItem(id=f"t{i}", text=TOWER, reference="1") for i in range(2)]
    )
    pid = backend.pid
    killer = threading.Thread(
        target=lambda: (wait_in_flight(backend), os.kill(pid, signal.SIGKILL))
    )
    killer.start()
    started = time.monotonic()
    with pytest.raises(ScorerProcessDied) as info:
        backend.compute_rewards(request)
    killer.join()
    assert time.monotonic() - started < 6
    assert info.value.signal_name == "SIGKILL"
    assert wait_until_gone(members, 5) == []


def _spawn_orphan_parent(
    python, scorer: str, params: dict, mode: str, members: int
) -> tuple[subprocess.Popen, dict]:
    parent = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.helpers.orphan_parent",
            str(python),
            scorer,
            json.dumps(params),
            mode,
            str(members),
        ],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    line = parent.stdout.readline()
    if not line:
        parent.kill()
        parent.wait(10)
        pytest.fail(f"orphan parent failed: {parent.stderr.read()}")
    return parent, json.loads(line)


@pytest.mark.slow
def test_kill_9_of_the_idle_trainer_leaves_no_process(math_python):
    """The mid-batch version, 20 trials, is tests/lifecycle/test_orphans.py."""
    # child, forkserver, tracker, template, 2 workers and the spare: the workers start after ready
    parent, info = _spawn_orphan_parent(
        math_python, "math_verify", {"jobs": 2, "timeout_s": 60}, "idle", 7
    )
    try:
        assert info["child"] in info["group"] and len(info["group"]) == 7, info
        parent.send_signal(signal.SIGKILL)
        parent.wait(10)
        survivors = wait_until_gone(info["group"], 5)
        assert survivors == [], f"survived their trainer by 5 s: {survivors}"
    finally:
        parent.kill()
        parent.wait(10)
        for pid in info["group"]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


@pytest.mark.slow
def test_killed_grading_worker_fails_one_call_then_the_pool_is_rebuilt(managed, math_python):
    backend = managed(math_python, "math_verify", params={"jobs": 2, "timeout_s": 10})
    backend.compute_rewards(RewardRequest(items=[PERCENT]))
    members = set(group_members(backend.pid))
    # forkserver, tracker
    helpers = {pid for pid in members if psutil.Process(pid).ppid() == backend.pid}
    workers = [pid for pid in members if pid != backend.pid and pid not in helpers]
    # the forkserver's child
    templates = [pid for pid in workers if psutil.Process(pid).ppid() in helpers]
    workers = [pid for pid in workers if pid not in templates]
    assert len(templates) == 1, f"expected one template (the forkserver's child), got {templates}"
    assert len(workers) == 3, (
        f"expected 2 workers and a spare (children of the template), got {workers}"
    )
    os.kill(workers[0], signal.SIGKILL)
    with pytest.raises(ScorerRequestError) as info:
        backend.compute_rewards(RewardRequest(items=math_items()[:2]))
    assert info.value.status == 500 and f"pid {workers[0]}" in str(info.value)
    assert "SIGKILL" in str(info.value)
    response = backend.compute_rewards(RewardRequest(items=[PERCENT]))
    assert response.rewards == [1.0]
    assert backend.pid and backend.health()["state"] == "ready"


@pytest.mark.slow
def test_bare_latex_golds_are_parsed_whole(managed, math_python):
    """A dataset gold like `2\\sqrt{2}` has no `$`: parsed raw, math_verify kept only the leading 2,
    so `\\boxed{2}` was graded right and `\\boxed{\\sqrt{8}}` wrong. Both directions are checked."""
    backend = managed(math_python, "math_verify", params={"jobs": 1, "timeout_s": 10})
    cases = {
        "sqrt8": ("\\boxed{\\sqrt{8}}", "2\\sqrt{2}", 1.0),
        "two": ("\\boxed{2}", "2\\sqrt{2}", 0.0),
        "half": ("\\boxed{0.5}", "\\frac{1}{2}", 1.0),
        "pi": ("\\boxed{3.14}", "\\pi", 0.0),
        "delimited": ("so $x^2+1$", "$x^2+1$", 1.0),
        "plain": ("\\boxed{12}", "12", 1.0),
    }
    request = RewardRequest(
        items=[
            RewardItem(id=name, text=text, reference=gold)
            for name, (text, gold, _) in cases.items()
        ]
    )
    got = dict(zip(request.ids, backend.compute_rewards(request).rewards, strict=True))
    assert got == {name: expected for name, (_, _, expected) in cases.items()}


def test_plain_number_golds_grade_as_math_verify_does(managed, math_python):
    """A plain-number gold is parsed as math_verify's default parses it (`1,22` -> 1.22, not the set
    {1, 22} that `\\boxed{1,22}` is); LaTeX golds keep the \\boxed{} wrapping. Expected values were
    computed with envs/math (math-verify 0.9.0, antlr 4.13.2) as verify(parse(g), parse(text)), with
    g the gold for plain numbers and `$gold$` for the others."""
    backend = managed(math_python, "math_verify", params={"jobs": 1, "timeout_s": 10})
    cases = {
        "comma_decimal": ("\\boxed{1.22}", "1,22", 1.0),
        "comma_decimal_not_a_set": ("\\boxed{1,22}", "1,22", 0.0),
        # math_verify's reading; a list needs `1, 2`
        "comma_decimal_short": ("\\boxed{1.2}", "1,2", 1.0),
        "list_with_space": ("\\boxed{1,2}", "1, 2", 1.0),
        "thousands": ("\\boxed{1000}", "1,000", 1.0),
        "thousands_many": ("\\boxed{12345678}", "12,345,678", 1.0),
        "thousands_space": ("\\boxed{1000}", "1 000", 1.0),
        "thousands_wrong": ("\\boxed{1}", "1,000", 0.0),
        "percent": ("\\boxed{0.1}", "10%", 1.0),
        "sqrt": ("\\boxed{\\sqrt{8}}", "2\\sqrt{2}", 1.0),
        "dfrac": ("\\boxed{0.75}", "\\dfrac{3}{4}", 1.0),
        "poly": ("so $x^2+1$", "x^2+1", 1.0),
        "poly_wrong": ("\\boxed{x^2}", "x^2+1", 0.0),
    }
    request = RewardRequest(
        items=[
            RewardItem(id=name, text=text, reference=gold)
            for name, (text, gold, _) in cases.items()
        ]
    )
    got = dict(zip(request.ids, backend.compute_rewards(request).rewards, strict=True))
    assert got == {name: expected for name, (_, _, expected) in cases.items()}


# -- hostile completions: a slow item does not hold a slot; memory is bounded and returns ------
HOSTILE = ("\\boxed{9^{9^{9^{9}}}}", "\\boxed{(10^{9})!}", "\\boxed{(x+1)^{100000}}")


def child_tree_rss(pid: int) -> int:
    tree = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    return sum(p.memory_info().rss for p in tree if p.is_running())


@pytest.mark.slow
def test_pathological_neighbours_change_no_ordinary_verdict_and_memory_returns(
    managed, math_python
):
    from bench.common import workload

    backend = managed(math_python, "math_verify", params={"jobs": 2, "timeout_s": 2})
    ordinary = [
        RewardItem(id=f"o{i}", text=t, reference=g) for i, (t, g) in enumerate(workload(0, 60))
    ]
    clean = backend.compute_rewards(RewardRequest(items=ordinary))
    memory_before = child_tree_rss(backend.pid)
    hostile = list(ordinary)
    for k, text in enumerate(HOSTILE):  # spread through the batch
        hostile.insert(5 + 20 * k, RewardItem(id=f"p{k}", text=text, reference="1"))
    response = backend.compute_rewards(RewardRequest(items=hostile))
    got = dict(zip(response.ids, response.rewards, strict=True))
    assert [got[item.id] for item in ordinary] == clean.rewards and len(set(clean.rewards)) == 2
    assert [got[f"p{k}"] for k in range(3)] == [0.0, 0.0, 0.0]
    values = response.diagnostics["math_verify"]["values"]
    assert values["overflowed"] >= 3 and values["timeouts"] + values["memory_exceeded"] == 3, values
    # the overflow workers are killed before the response; those with large heaps may still be
    # exiting when it arrives (the pool reaps them once gone), so their memory returns within
    # moments
    settle = time.monotonic() + 5.0
    while child_tree_rss(backend.pid) >= memory_before + 64 * 2**20 and time.monotonic() < settle:
        time.sleep(0.05)
    assert child_tree_rss(backend.pid) < memory_before + 64 * 2**20
    assert backend.compute_rewards(RewardRequest(items=[PERCENT])).rewards == [1.0]


@pytest.mark.slow
def test_a_memory_bomb_scores_zero_counted_and_the_child_keeps_serving(managed, math_python):
    backend = managed(
        math_python, "math_verify", params={"jobs": 1, "timeout_s": 10, "memory_cap_mb": 64}
    )
    pid = backend.pid
    bomb = RewardItem(id="bomb", text="\\boxed{(x+1)^{100000}}", reference="1")
    response = backend.compute_rewards(RewardRequest(items=[bomb, PERCENT]))
    assert response.rewards == [0.0, 1.0]
    assert response.diagnostics["math_verify"]["values"]["memory_exceeded"] == 1
    assert (
        backend.compute_rewards(RewardRequest(items=[PERCENT])).rewards == [1.0]
        and backend.pid == pid
    )


@pytest.mark.slow
def test_the_hostile_tail_is_paid_once_per_call_however_it_is_chunked(managed, math_python):
    """256 ordinary items and 4 pathological ones in different chunks of the default
    request_batch_size (64): the chunks go to the child together and share its pool, so the
    call pays about one timeout (bench.hostile_math: the +1 s figure), not one per chunk (+8 s
    here before). Through the managed backend, a remote client of the same child, a panel term
    and two replicas."""
    from bench.common import workload
    from supervisor import PanelTerm, RemoteRewardBackend, ReplicatedBackend, RewardPanel

    timeout_s = 2.0
    params = {"jobs": 2, "timeout_s": timeout_s}
    backend = managed(math_python, "math_verify", params=params)
    remote = RemoteRewardBackend(
        f"http://127.0.0.1:{backend._child.port}", token=backend._child.token
    )
    panel = RewardPanel([PanelTerm("math", backend)], owns_backends=False)
    replicas = ReplicatedBackend(
        {
            **backend.spec.model_dump(mode="json"),
            "replicas": {"count": 2},
            "client": {"input_kind": "text"},
        }
    )
    start = 0

    def batch(hazards: int) -> RewardRequest:
        nonlocal start
        items = [
            RewardItem(id=f"o{start + i}", text=t, reference=g)
            for i, (t, g) in enumerate(workload(start, 256))
        ]
        start += 256
        for k in range(hazards):  # one in each of the first `hazards` chunks of 64
            items.insert(
                64 * k + 10,
                RewardItem(id=f"p{start}-{k}", text=HOSTILE[k % len(HOSTILE)], reference="1"),
            )
        return RewardRequest(items=items)

    try:
        for through in (backend, remote, panel, replicas):
            through.compute_rewards(batch(0))  # warm: every worker has graded
            clean_s = timed(lambda: through.compute_rewards(batch(0)))  # noqa: B023 - called at once
            hostile = batch(4)
            began = time.monotonic()
            response = through.compute_rewards(hostile)
            hostile_s = time.monotonic() - began
            got = dict(zip(response.ids, response.rewards, strict=True))
            assert [got[item.id] for item in hostile.items if item.id.startswith("p")] == [0.0] * 4
            # one timeout per chunk would cost 4 (8 s); the bound leaves room for the load to differ
            # between the two calls on a shared machine
            assert hostile_s - clean_s < 3 * timeout_s, (type(through).__name__, clean_s, hostile_s)
    finally:
        remote.close()
        panel.close()
        replicas.close()


def timed(call) -> float:
    began = time.monotonic()
    call()
    return time.monotonic() - began
