"""code_exec test formats: each parsed into one plan, malformed ones a CaseError naming the field;
prime_code's output rules held to verl 0.9.1's own `run_test`."""

from __future__ import annotations

import base64
import json
import pickle
import subprocess
import zlib
from pathlib import Path

import pytest

from scorers.base import ScoreInputError
from scorers.code_exec.bare import BareRunner
from scorers.code_exec.cases import (
    PRIME_PRELUDE,
    AssertTest,
    CallTest,
    CaseError,
    StdioTest,
    parse_cases,
)
from scorers.code_exec.compare import stdout_matches, value_matches
from scorers.code_exec.grade import Deadlines, grade
from tests.conftest import REPO_ROOT, env_python

PRIME_CODE = (
    REPO_ROOT / "envs/trl/.venv/lib/python3.11/site-packages/verl/utils/reward_score/prime_code"
)


def test_prime_code_stdio_and_call_based():
    plan = parse_cases(json.dumps({"inputs": ["1 2\n", "3 4\n5"], "outputs": ["3\n", "7"]}))
    assert plan.format == "prime_code" and plan.prelude == PRIME_PRELUDE
    assert plan.tests == (StdioTest("1 2\n", "3\n", "prime"), StdioTest("3 4\n5", "7", "prime"))
    plan = parse_cases({"inputs": ['[1, 2]\n"x"', [3]], "outputs": ["[3]", 4], "fn_name": "f"})
    assert plan.fn_name == "f"
    assert plan.tests[0] == CallTest(([1, 2], "x"), [3], "prime", prime_keys=True)
    assert plan.tests[1] == CallTest((3,), 4, "prime", prime_keys=True)


def test_livecodebench_plain_and_compressed_cases():
    private = [{"input": "[1, 2]\n3", "output": "6", "testtype": "functional"}]
    packed = base64.b64encode(zlib.compress(pickle.dumps(json.dumps(private)))).decode()
    public = json.dumps([{"input": "1\n", "output": "1\n", "testtype": "stdin"}])
    plan = parse_cases(
        {
            "public_test_cases": public,
            "private_test_cases": packed,
            "metadata": json.dumps({"func_name": "total"}),
        }
    )
    assert plan.format == "livecodebench" and plan.fn_name == "total"
    assert plan.tests == (StdioTest("1\n", "1\n", "lcb"), CallTest(([1, 2], 3), 6, "lcb"))


def test_humaneval_mbpp_and_function_pairs():
    plan = parse_cases({"prompt": "def f(x):\n", "test": "def check(c): pass", "entry_point": "f"})
    assert plan.prefix == "def f(x):\n"
    assert plan.tests == (AssertTest("def check(c): pass\ncheck(f)\n", "check(f)"),)
    plan = parse_cases({"test_list": ["assert f(1) == 1"], "test_setup_code": "import math"})
    assert plan.format == "mbpp" and plan.setup == "import math" and len(plan.tests) == 1
    plan = parse_cases(
        {"fn_name": "g", "cases": [[[1], 2], {"args": [], "kwargs": {"a": 1}, "expected": 3}]}
    )
    assert plan.tests == (CallTest((1,), 2, "exact"), CallTest((), 3, "exact", kwargs={"a": 1}))


@pytest.mark.parametrize(
    ("reference", "field"),
    [
        ({"inputs": ["1"], "outputs": []}, "outputs"),
        ({"inputs": [], "outputs": []}, "tests"),
        ({"inputs": [5], "outputs": ["1"]}, "inputs[0]"),
        ({"inputs": ["1"], "outputs": [["1"]]}, "outputs[0]"),  # verl's run_test asserts str
        ({"inputs": ["{bad"], "outputs": ["1"], "fn_name": "f"}, "inputs[0] line 0"),
        ({"inputs": ["1"], "outputs": ["1"], "fn_name": "no such"}, "fn_name"),
        ({"public_test_cases": "%%%"}, "public_test_cases"),
        (
            {"public_test_cases": [{"input": "1", "output": "1", "testtype": "x"}]},
            "public_test_cases[0].testtype",
        ),  # fmt: skip
        (
            {"public_test_cases": [{"input": "1", "output": "1", "testtype": "functional"}]},
            "metadata.func_name",
        ),  # fmt: skip
        ({"test": "assert True", "entry_point": "f"}, "test"),
        ({"test_list": ["assert 1", ""]}, "test_list[1]"),
        ({"test_list": ["assert 1"], "test_setup_code": 3}, "test_setup_code"),
        ({"fn_name": "f", "cases": [[1, 2, 3]]}, "cases[0]"),
        ({"fn_name": "f", "cases": [{"args": [{1, 2}], "expected": 1}]}, "cases[0]"),
        ({"unknown": 1}, "reference"),
        ("not json", "reference"),
    ],
)
def test_a_malformed_case_is_a_typed_error_naming_its_field(reference, field):
    with pytest.raises(CaseError) as caught:
        parse_cases(reference)
    assert caught.value.field == field
    assert isinstance(caught.value, ScoreInputError)  # a 4xx for the child, never a reward of 0


def test_a_compressed_case_that_names_a_global_is_refused_unrun(tmp_path: Path):
    marker = tmp_path / "ran"

    class Evil:
        def __reduce__(self):
            return (Path.touch, (marker,))

    packed = base64.b64encode(zlib.compress(pickle.dumps(Evil()))).decode()
    with pytest.raises(CaseError, match="refusing") as caught:
        parse_cases({"private_test_cases": packed})
    assert caught.value.field == "private_test_cases" and not marker.exists()


def test_the_prelude_is_verl_prime_codes_own():
    source = (PRIME_CODE / "testing_util.py").read_text()
    assert json.dumps(PRIME_PRELUDE)[1:-1] in source


def test_lcb_and_exact_rules():
    assert stdout_matches("lcb", " 1.50 2\n\n", "1.5 2")
    assert not stdout_matches("lcb", "1 2\n3", "1 2")
    assert not stdout_matches("lcb", "abc", "abd")
    assert value_matches("lcb", (1, 2), [1, 2]) and not value_matches("lcb", [1, 2], [2, 1])
    assert value_matches("exact", {"a": [1]}, {"a": [1]}) and not value_matches("exact", 1, 2)


# (program, in_outs) pairs on prime_code's edges: stripping, blank lines, floats, digit strings,
# tuples, a dict's int keys, a wrong answer, a runtime error
ORACLE_CASES = [
    ("print(input().strip() + '  ')", {"inputs": ["abc\n"], "outputs": ["abc\n"]}),
    ("print('1\\n\\n2')", {"inputs": [""], "outputs": ["1\n2\n"]}),
    ("print(0.1 + 0.2)", {"inputs": [""], "outputs": ["0.3\n"]}),
    ("print(0.31)", {"inputs": [""], "outputs": ["0.3\n"]}),
    ("print('01')", {"inputs": [""], "outputs": ["1\n"]}),
    ("print('1.0')", {"inputs": [""], "outputs": ["1\n"]}),
    ("print(1, 2)", {"inputs": [""], "outputs": ["1  2"]}),
    ("print('a b')", {"inputs": [""], "outputs": ["a  b"]}),
    ("raise ValueError('no')", {"inputs": [""], "outputs": ["x"]}),
    ("def f(a):\n    return (a, a)", {"fn_name": "f", "inputs": ["1"], "outputs": ["[1, 1]"]}),
    ("def f(a):\n    return [(a, 2)]", {"fn_name": "f", "inputs": ["1"], "outputs": ["[[1, 2]]"]}),
    (
        "def f(a):\n    return [(a, 2)]",
        {"fn_name": "f", "inputs": ["1"], "outputs": ["[[[1, 2]]]"]},
    ),
    ("def f(a):\n    return a", {"fn_name": "f", "inputs": ['{"1": 2}'], "outputs": ['{"1": 2}']}),
    ("def f(a):\n    return a + 1", {"fn_name": "f", "inputs": ["1"], "outputs": ["[2]"]}),
    ("def f(a):\n    return a + 1", {"fn_name": "f", "inputs": ["1"], "outputs": ["3"]}),
    ("def f(a):\n    return {a}", {"fn_name": "f", "inputs": ["1"], "outputs": ["[1]"]}),
    (
        "class Solution:\n    def f(self, a):\n        return a * 2",
        {"fn_name": "f", "inputs": ["4"], "outputs": ["8"]},
    ),  # fmt: skip
]


@pytest.mark.parametrize("stdio_runs", ["shared", "separate"])
def test_verdicts_equal_verl_prime_codes_own_run_test(stdio_runs):
    """Each case graded by grade() (bare runner) and by verl's own run_test: pass equals pass."""
    payload = json.dumps([{"code": code, "in_outs": in_outs} for code, in_outs in ORACLE_CASES])
    oracle = subprocess.run(
        [str(env_python("trl")), "-m", "tests.helpers.verl_prime_oracle"],
        input=payload, capture_output=True, text=True, timeout=120, cwd=REPO_ROOT, check=True,
    )  # fmt: skip
    theirs = [all(r is True for r in results) for results in json.loads(oracle.stdout)]
    deadlines = Deadlines(per_test_s=5.0, load_s=5.0, completion_s=60.0, startup_s=10.0)
    python = str(env_python("trl"))
    ours = [
        grade(code, parse_cases(in_outs), BareRunner(), python, deadlines=deadlines,
              stdio_runs=stdio_runs).reward == 1.0
        for code, in_outs in ORACLE_CASES
    ]  # fmt: skip
    assert ours == theirs
    assert 0 < sum(theirs) < len(theirs)  # the cases hold both verdicts
