"""`grade`: one completion against one plan of tests, through a `Runner` (the sandbox).

Tests run in harness runs (`harness.py`): the call and assert tests of a completion together in
one interpreter, its stdin/stdout tests together in another run, each program run a forked child
of the harness (`stdio_runs="separate"`: each in a run of its own instead, the program started by
the runner). When a run ends early (an exit, a signal, the wall deadline while the harness's own
timer was blocked), the test in flight takes the run's outcome and a fresh run takes the tests
left. Every run is a fresh sandbox: nothing of one completion's state reaches another. Each run's
wall and CPU bounds come from `Deadlines` (the `limits` given bound memory, processes, files);
the completion's own deadline bounds them all, and a test it leaves no time for is a timeout,
"not run". Output is compared in the parent, where the expected values stay.
"""

from __future__ import annotations

import functools
import json
import math
import secrets
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

from scorers.code_exec.cases import AssertTest, StdioTest, Test, TestPlan
from scorers.code_exec.compare import stdout_matches
from scorers.code_exec.report import BrokenReport, HarnessReport, read_report, verdict_of
from scorers.code_exec.run_types import Limits, Runner, RunResult
from scorers.code_exec.verdicts import (
    GradeResult,
    Outcome,
    RewardPolicy,
    TestVerdict,
    reward_of,
)
from scorers.common.processes import signal_name

HARNESS_FILE = "harness.py"
SOLUTION_FILE = "solution.py"
# one program run's stdout kept by the harness, and the report it writes in one run before it
# stops and leaves the rest to a fresh run: the runner must keep at least 8 MiB of stdout (a
# program's 1 MiB may grow up to 6x as JSON)
PROGRAM_OUTPUT_BYTES = 1 << 20
REPORT_BYTES = 1 << 20
StdioRuns = Literal["shared", "separate"]
_TAIL_CHARS = 300


@dataclass(frozen=True)
class Deadlines:
    """Seconds: one test (a call, an assert, one stdin/stdout run), loading the code in the
    harness, the whole completion, and the start of a run (interpreter and sandbox) on top."""

    per_test_s: float = 5.0
    load_s: float = 10.0
    completion_s: float = 60.0
    startup_s: float = 5.0

    def __post_init__(self) -> None:
        for name in ("per_test_s", "load_s", "completion_s", "startup_s"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"deadline {name} must be a positive number, got {value!r}")


@functools.cache
def harness_source() -> bytes:
    """The harness as it is shipped into the sandbox."""
    return Path(__file__).with_name(HARNESS_FILE).read_bytes()


@dataclass(frozen=True)
class _Job:
    code: str
    plan: TestPlan
    runner: Runner
    python: str
    limits: Limits
    deadlines: Deadlines
    ends_at: float

    def left(self) -> float:
        return self.ends_at - time.monotonic()

    def limits_for(self, wall_s: float, cpu_s: float) -> Limits:
        wall = min(wall_s, self.left())
        return replace(self.limits, wall_s=wall, cpu_s=min(cpu_s, wall + 1.0))

    def not_run(self, index: int) -> TestVerdict:
        detail = f"not run: the completion's deadline of {self.deadlines.completion_s:g} s passed"
        return TestVerdict(index, Outcome.TIMEOUT, detail)


def grade(
    completion: str,
    plan: TestPlan,
    runner: Runner,
    python: str,
    limits: Limits | None = None,
    *,
    deadlines: Deadlines | None = None,
    policy: RewardPolicy = "fraction",
    stdio_runs: StdioRuns = "shared",
) -> GradeResult:
    """The reward of `completion` on `plan` and every test's verdict (in the plan's order).

    `completion` is the program (HumanEval's: the continuation of the plan's prompt); `python`
    the interpreter that runs it in `runner`. Raises `SandboxFailed` (no reward) when a run's
    sandbox failed.
    """
    d = deadlines or Deadlines()
    job = _Job(completion if not plan.prefix else plan.prefix + completion, plan, runner,
               python, limits or Limits(), d, time.monotonic() + d.completion_s)  # fmt: skip
    verdicts: dict[int, TestVerdict] = {}
    stdio = [i for i, t in enumerate(plan.tests) if isinstance(t, StdioTest)]
    inproc = [i for i, t in enumerate(plan.tests) if not isinstance(t, StdioTest)]
    if inproc:
        verdicts.update(_harness_runs(job, inproc, programs=False))
    if stdio and stdio_runs == "shared":
        verdicts.update(_harness_runs(job, stdio, programs=True))
    else:
        for index, test in enumerate(plan.tests):
            if isinstance(test, StdioTest):
                verdicts[index] = _stdio(job, index, test)
    ordered = tuple(verdicts[i] for i in range(len(plan.tests)))
    return GradeResult(reward_of(ordered, policy), ordered)


def _tail(data: bytes) -> str:
    text = data.decode("utf-8", "replace").strip()
    return text[-_TAIL_CHARS:]


def run_outcome(result: RunResult, when: str) -> tuple[Outcome, str]:
    """A run that ended without a verdict for the test in flight: that test's outcome."""
    tail = _tail(result.stderr)
    where = f"{when}: "
    if result.status == "timeout":
        bounds = f"{result.wall_s:.1f} s wall, {result.cpu_s:.1f} s CPU"
        return Outcome.TIMEOUT, where + f"past the run's deadline ({bounds})"
    if result.status == "memory":
        return Outcome.MEMORY, where + "past the memory bound"
    if result.status == "sandbox_error":
        return Outcome.SANDBOX_ERROR, where + f"the sandbox failed: {tail or 'no stderr'}"
    if result.status == "output_limit":
        return Outcome.CRASH, where + "wrote past the output limit"
    if result.status == "signalled":
        return Outcome.CRASH, where + f"killed by {signal_name(result.signal or 0)}"
    if tail.endswith("MemoryError"):
        return Outcome.MEMORY, where + f"exit {result.returncode}: MemoryError"
    return Outcome.CRASH, where + f"exit {result.returncode}" + (f": {tail}" if tail else "")


def _stdio(job: _Job, index: int, test: StdioTest) -> TestVerdict:
    if job.left() <= 0:
        return job.not_run(index)
    d = job.deadlines
    result = job.runner.run_sandboxed(
        [job.python, "-I", SOLUTION_FILE],
        python=job.python,
        stdin=test.stdin.encode("utf-8"),
        files={SOLUTION_FILE: (job.plan.prelude + job.code).encode("utf-8")},
        limits=job.limits_for(d.per_test_s + d.startup_s, d.per_test_s + 1.0),
    )
    if result.status != "exited" or result.returncode != 0:
        outcome, detail = run_outcome(result, "the program")
        return TestVerdict(index, outcome, detail, result.wall_s)
    output = result.stdout.decode("utf-8", "replace")
    if stdout_matches(test.rule, output, test.expected):
        return TestVerdict(index, Outcome.PASSED, "", result.wall_s)
    return TestVerdict(index, Outcome.FAILED, "wrong output: " + output[:200], result.wall_s)


def _test_body(index: int, test: Test) -> dict[str, Any]:
    """One test as the harness gets it: never the expected value of a call or a program."""
    if isinstance(test, AssertTest):
        return {"i": index, "kind": "assert", "source": test.source}
    if isinstance(test, StdioTest):
        return {"i": index, "kind": "stdio", "stdin": test.stdin}
    call = {"i": index, "kind": "call", "args": list(test.args), "kwargs": test.kwargs}
    return call | {"prime_keys": test.prime_keys}


def _payload(job: _Job, pending: list[int], nonce: str, programs: bool) -> bytes:
    d = job.deadlines
    payload = {
        "nonce": nonce,
        "programs": programs,
        "code": job.code,
        "prelude": job.plan.prelude,
        "setup": job.plan.setup,
        "fn_name": job.plan.fn_name,
        "solution_class": job.plan.format in ("prime_code", "livecodebench"),
        "load_s": d.load_s,
        "per_test_s": d.per_test_s,
        "output_cap": PROGRAM_OUTPUT_BYTES,
        "report_bytes": REPORT_BYTES,
        "tests": [_test_body(i, job.plan.tests[i]) for i in pending],
    }
    return json.dumps(payload).encode("utf-8")


def _harness_runs(job: _Job, tests: list[int], programs: bool) -> dict[int, TestVerdict]:
    """The tests through harness runs, a fresh one for the tests a run left."""
    verdicts: dict[int, TestVerdict] = {}
    pending = list(tests)
    while pending:
        if job.left() <= 0:
            verdicts.update({i: job.not_run(i) for i in pending})
            break
        nonce = secrets.token_hex(16)
        d = job.deadlines
        seconds = d.startup_s + d.load_s + d.per_test_s * len(pending)
        result = job.runner.run_sandboxed(
            [job.python, "-I", HARNESS_FILE],
            python=job.python,
            stdin=_payload(job, pending, nonce, programs),
            files={HARNESS_FILE: harness_source()},
            limits=job.limits_for(seconds, seconds - d.startup_s + 1.0),
        )
        settled, pending = _settle(job, read_report(result.stdout, nonce, pending), result, pending)
        verdicts.update(settled)
    return verdicts


def _all(pending: list[int], outcome: Outcome, detail: str) -> dict[int, TestVerdict]:
    return {i: TestVerdict(i, outcome, detail) for i in pending}


def _load_failure(report: HarnessReport, result: RunResult) -> tuple[Outcome, str]:
    if report.load_error is None:
        return run_outcome(result, "while the code loaded")
    outcome, detail = report.load_error.get("outcome"), str(report.load_error.get("detail"))
    if outcome not in ("timeout", "memory", "crash", "failed"):
        return Outcome.CRASH, f"the harness's report was garbled: load outcome {outcome!r:.20}"
    kind = Outcome.CRASH if outcome == "failed" else Outcome(outcome)
    return kind, "while the code loaded: " + detail[:_TAIL_CHARS]


def _settle(
    job: _Job, report: HarnessReport, result: RunResult, pending: list[int]
) -> tuple[dict[int, TestVerdict], list[int]]:
    """The verdicts one harness run settled, and the tests left for a fresh run."""
    if result.status == "sandbox_error":
        return _all(pending, *run_outcome(result, "the harness")), []
    if report.broken is not None:
        return _all(pending, Outcome.CRASH, f"forged or garbled report: {report.broken}"), []
    if not report.loaded:
        return _all(pending, *_load_failure(report, result)), []
    try:
        got = {i: verdict_of(i, job.plan.tests[i], b) for i, b in report.verdicts.items()}
    except BrokenReport as exc:
        return _all(pending, Outcome.CRASH, f"forged or garbled report: {exc}"), []
    rest = [i for i in pending if i not in got]
    if report.done or not rest:
        return got, []
    if report.in_flight is None and (report.stopped or got):
        # between two tests (the watchdog's stop, or the code's own thread): the rest run afresh
        return got, rest
    # the test in flight takes the run's outcome; a run that settled nothing blames the first
    victim = report.in_flight if report.in_flight is not None else rest[0]
    outcome, detail = run_outcome(result, f"the run ended while test {victim} ran")
    got[victim] = TestVerdict(victim, outcome, detail, None)
    return got, [i for i in rest if i != victim]
