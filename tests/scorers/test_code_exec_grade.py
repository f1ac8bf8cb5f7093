"""grade() with the bare runner: each format graded right on small hand cases, and what a hostile
completion tries (exit, os._exit, printing or forging a verdict, swallowing its timer) never
passes a test. Every run is a real process; the leak guard checks none is left."""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence

import pytest

from scorers.code_exec import (
    Deadlines,
    Limits,
    Outcome,
    RunResult,
    SandboxFailed,
    grade,
    outcome_counts,
    parse_cases,
)
from scorers.code_exec.bare import BareRunner

PY = sys.executable
# generous on a loaded 2-core box; the short per-test deadline only makes the timeout cases quick
FAST = Deadlines(per_test_s=0.5, load_s=5.0, completion_s=60.0, startup_s=10.0)
ADD = {"inputs": ["1\n2", "3\n4", "5\n6"], "outputs": ["3", "7", "11"], "fn_name": "add"}
STDIO = {"inputs": ["1 2\n", "3 4\n"], "outputs": ["3\n", "7\n"]}


def outcomes(code: str, reference, **kwargs) -> list[str]:
    result = grade(code, parse_cases(reference), BareRunner(), PY, deadlines=FAST, **kwargs)
    return [v.outcome.value for v in result.verdicts]


def test_call_based_pass_wrong_and_exception():
    assert outcomes("def add(a, b):\n    return a + b\n", ADD) == ["passed"] * 3
    assert outcomes("def add(a, b):\n    return a - b\n", ADD) == ["failed"] * 3
    code = "def add(a, b):\n    if a == 3:\n        raise ValueError('no')\n    return a + b\n"
    result = grade(code, parse_cases(ADD), BareRunner(), PY, deadlines=FAST)
    assert [v.outcome for v in result.verdicts] == [Outcome.PASSED, Outcome.CRASH, Outcome.PASSED]
    assert "ValueError: no" in result.verdicts[1].detail
    assert result.reward == pytest.approx(2 / 3)
    assert outcome_counts(result.verdicts)["tests_crash"] == 1


STDIO_CASES = [
    ("a, b = map(int, input().split())\nprint(a + b)\n", ["passed"] * 2),
    ("a, b = map(int, input().split())\nprint(a * b)\n", ["failed"] * 2),
    ("raise SystemExit(3)\n", ["crash"] * 2),
    ("import sys\nprint(sum(map(int, sys.stdin.read().split())))\nsys.exit(0)\n", ["passed"] * 2),
    ("import sys\nsys.exit('usage')\n", ["crash"] * 2),
    ("x = bytearray(1 << 34)\n", ["memory"] * 2),
    ("import os\nprint(3)\nos._exit(0)\n", ["failed"] * 2),  # unflushed, as in python itself
    (
        "import threading\ndef main():\n    print(sum(map(int, input().split())))\n"
        "threading.Thread(target=main).start()\n",
        ["passed"] * 2,
    ),  # fmt: skip
    (
        "import sys, time\nprint(sum(map(int, input().split())))\nsys.stdout.close()\n"
        "time.sleep(0.2)\n",
        ["passed"] * 2,
    ),  # python lets a program close its stdout
    (
        "if int(input().split()[0]) == 3:\n    while True:\n        pass\nprint(3)\n",
        ["passed", "timeout"],
    ),  # fmt: skip
]


@pytest.mark.parametrize("stdio_runs", ["shared", "separate"])
@pytest.mark.parametrize(("code", "expected"), STDIO_CASES)
def test_stdio_programs_in_one_run_or_one_run_each(code, expected, stdio_runs):
    assert outcomes(code, STDIO, stdio_runs=stdio_runs) == expected


def test_a_report_past_its_size_continues_in_a_fresh_run():
    reference = {"inputs": ["1\n"] * 3, "outputs": ["x" * 700_000 + "\n"] * 3}
    assert outcomes("input()\nprint('x' * 700_000)\n", reference) == ["passed"] * 3


def test_a_program_over_its_output_cap_is_a_crash():
    reference = {"inputs": ["1\n"], "outputs": ["x\n"]}
    assert outcomes("print('x' * (2 << 20))\n", reference) == ["crash"]


def test_livecodebench_functional_with_a_solution_class_and_stdin():
    reference = {
        "public_test_cases": [
            {"input": "[1, 2, 3]", "output": "6", "testtype": "functional"},
            {"input": "[]", "output": "0", "testtype": "functional"},
        ],
        "metadata": {"func_name": "total"},
    }
    code = "class Solution:\n    def total(self, xs: List[int]) -> int:\n        return sum(xs)\n"
    assert outcomes(code, reference) == ["passed", "passed"]
    stdin = {"public_test_cases": [{"input": "2\n", "output": "4.000\n", "testtype": "stdin"}]}
    assert outcomes("print(int(input()) * 2)\n", stdin) == ["passed"]


def test_humaneval_mbpp_and_function_pairs():
    humaneval = {
        "prompt": "def inc(x):\n",
        "test": "def check(candidate):\n    assert candidate(1) == 2\n",
        "entry_point": "inc",
    }
    assert outcomes("    return x + 1\n", humaneval) == ["passed"]
    assert outcomes("    return x\n", humaneval) == ["failed"]
    mbpp = {
        "test_list": ["assert sq(2) == 4", "assert sq(3) == 10", "assert sq(K) == 49"],
        "test_setup_code": "K = 7",
    }
    assert outcomes("def sq(x):\n    return x * x\n", mbpp) == ["passed", "failed", "passed"]
    pairs = {
        "fn_name": "f",
        "cases": [[[2], [2, 2]], {"args": [1], "kwargs": {"n": 3}, "expected": [1, 1, 1]}],
    }
    assert outcomes("def f(x, n=2):\n    return (x,) * n\n", pairs) == ["passed", "passed"]


def test_a_timeout_is_typed_and_the_other_tests_still_graded():
    code = "def add(a, b):\n    while a == 3:\n        pass\n    return a + b\n"
    result = grade(code, parse_cases(ADD), BareRunner(), PY, deadlines=FAST)
    assert [v.outcome.value for v in result.verdicts] == ["passed", "timeout", "passed"]
    assert "deadline" in result.verdicts[1].detail
    assert outcome_counts(result.verdicts)["tests_timeout"] == 1
    assert outcomes("while True:\n    pass\n", {"inputs": ["1\n"], "outputs": ["1\n"]}) == [
        "timeout"
    ]


def test_a_program_that_swallows_its_timer_is_timed_out_by_the_watchdog():
    code = (
        "def add(a, b):\n    while a == 3:\n        try:\n            n = 0\n"
        "            while True:\n                n += 1\n        except BaseException:\n"
        "            pass\n    return a + b\n"
    )
    result = grade(code, parse_cases(ADD), BareRunner(), PY, deadlines=FAST)
    assert [v.outcome.value for v in result.verdicts] == ["passed", "timeout", "passed"]
    assert "holding out against its timer" in result.verdicts[1].detail


def test_memory_is_typed():
    code = "def add(a, b):\n    return len(bytearray(1 << 34))\n"
    result = grade(code, parse_cases(ADD), BareRunner(), PY, Limits(memory_bytes=1 << 30),
                   deadlines=FAST)  # fmt: skip
    assert {v.outcome for v in result.verdicts} == {Outcome.MEMORY}


@pytest.mark.parametrize(
    "code",
    [
        "import sys\ndef add(a, b):\n    sys.exit(0)\n",
        "import sys\nsys.exit(0)\n",
        "def add(a, b):\n    exit(0)\n",
        "import os\ndef add(a, b):\n    os._exit(0)\n",
        "import os\nos._exit(0)\n",
        "import os, signal\ndef add(a, b):\n    os.kill(os.getpid(), signal.SIGKILL)\n",
    ],
)
def test_exiting_passes_nothing(code):
    assert set(outcomes(code, ADD)) == {"crash"}


def test_exiting_early_in_a_stdio_program_with_the_right_output_is_judged_on_its_output():
    assert (
        outcomes("import sys\nprint(sum(map(int, input().split())))\nsys.exit(0)\n", STDIO)
        == ["passed"] * 2
    )


def test_printing_a_verdict_passes_nothing():
    code = (
        "print('passed')\nimport sys\nsys.__stdout__.write('ok\\n')\n"
        "def add(a, b):\n    print('verdict 0 passed')\n    return 0\n"
    )
    assert outcomes(code, ADD) == ["failed"] * 3


# The code finds the harness's nonce and private fd in its own interpreter (what in-process code
# can always do) and writes a verdict the harness did not: out of order, it breaks the report.
FORGER = """
import gc, json, os
def _forge():
    payload = next(o for o in gc.get_objects() if isinstance(o, dict) and 'nonce' in o)
    report = next(o for o in gc.get_objects() if type(o).__name__ == 'Reporter')
    line = payload['nonce'] + ' verdict ' + json.dumps({'i': %d, 'outcome': 'passed',
        'detail': '', 'wall_s': 0.0}) + '\\n'
    os.write(report.fd, line.encode())
"""


def test_a_verdict_forged_with_the_nonce_out_of_order_is_a_crash():
    mbpp = {"test_list": ["assert sq(2) == 5", "assert sq(3) == 10"]}
    code = FORGER % 0 + "_forge()\ndef sq(x):\n    return x * x\n"
    result = grade(code, parse_cases(mbpp), BareRunner(), PY, deadlines=FAST)
    assert {v.outcome for v in result.verdicts} == {Outcome.CRASH}
    assert "forged or garbled report" in result.verdicts[0].detail


def test_a_forged_call_verdict_cannot_know_the_expected_value():
    # the forger writes an "ok" verdict for the test in flight, then kills the harness: the value
    # it reports is judged by the parent against the expected value, which it never saw
    code = FORGER.replace("'passed'", "'ok', 'output': 0") % 1 + (
        "import os, signal\ndef add(a, b):\n    if a == 3:\n        _forge()\n"
        "        os.kill(os.getpid(), signal.SIGKILL)\n    return a + b\n"
    )
    assert outcomes(code, ADD) == ["passed", "failed", "passed"]


def test_all_or_nothing_policy():
    code = "def add(a, b):\n    return 7\n"
    assert grade(code, parse_cases(ADD), BareRunner(), PY, deadlines=FAST).reward == pytest.approx(
        1 / 3
    )
    assert (
        grade(code, parse_cases(ADD), BareRunner(), PY, deadlines=FAST, policy="all").reward == 0.0
    )
    right = "def add(a, b):\n    return a + b\n"
    assert (
        grade(right, parse_cases(ADD), BareRunner(), PY, deadlines=FAST, policy="all").reward == 1.0
    )


def test_tests_the_completion_deadline_leaves_no_time_for_are_timeouts_not_run():
    slow = Deadlines(per_test_s=5.0, load_s=5.0, completion_s=1.0, startup_s=10.0)
    code = "import time\ndef add(a, b):\n    time.sleep(10)\n"
    result = grade(code, parse_cases(ADD), BareRunner(), PY, deadlines=slow)
    assert [v.outcome for v in result.verdicts] == [Outcome.TIMEOUT] * 3
    assert "not run" in result.verdicts[1].detail


class _FailingSandbox:
    """A runner whose sandbox fails to start (the real sandbox's own failure is helper A's test):
    it runs nothing and says so."""

    def run_sandboxed(
        self,
        argv: Sequence[str],
        *,
        python: str,
        stdin: bytes = b"",
        files: Mapping[str, bytes] | None = None,
        limits: Limits | None = None,
    ) -> RunResult:
        return RunResult("sandbox_error", None, None, b"", b"bwrap: setting up uid map", 0.0, 0.0)


@pytest.mark.parametrize("reference", [ADD, STDIO])
def test_a_sandbox_error_gives_no_reward_never_a_zero(reference):
    with pytest.raises(SandboxFailed, match="setting up uid map") as caught:
        grade("def add(a, b):\n    return a + b\n", parse_cases(reference), _FailingSandbox(), PY)
    assert {v.outcome for v in caught.value.verdicts} == {Outcome.SANDBOX_ERROR}


def test_the_bare_runner_keeps_nothing_behind(tmp_path):
    """A background child the program leaves in its group is killed with the group."""
    code = (
        "import subprocess, sys\nsubprocess.Popen([sys.executable, '-c', "
        "'import time; time.sleep(60)'])\nprint(int(input()) + 1)\n"
    )
    assert outcomes(code, {"inputs": ["1\n"], "outputs": ["2\n"]}) == ["passed"]


def test_a_frame_nested_past_the_parser_is_a_crash_not_an_error():
    body = "json.dumps({'i': %d, 'outcome': 'passed',\n        'detail': '', 'wall_s': 0.0})"
    code = FORGER.replace(body, "'[' * 100000 + str(%d) + ']' * 100000") % 0
    assert "100000" in code
    mbpp = {"test_list": ["assert sq(2) == 4"]}
    result = grade(code + "_forge()\ndef sq(x):\n    return x * x\n", parse_cases(mbpp),
                   BareRunner(), PY, deadlines=FAST)  # fmt: skip
    assert [v.outcome for v in result.verdicts] == [Outcome.CRASH]


def test_the_bare_runner_stops_a_flood_of_output():
    runner = BareRunner(output_bytes=1 << 16)
    result = runner.run_sandboxed(
        [PY, "-c", "import sys\nwhile True:\n    sys.stdout.write('x' * 4096)\n"],
        python=PY,
        limits=Limits(wall_s=30.0),
    )
    assert result.status == "output_limit" and len(result.stdout) == 1 << 16
