"""Output comparison, in the parent (never in the sandbox): a program's stdout or a function's
return value against the expected one, by the rules of the format it came from.

- "prime": verl 0.9.1's `prime_code` (`testing_util.run_test`): for stdout, a stripped text match,
  then line lists with empty lines dropped and lines stripped, then lines as floats within
  numpy's `allclose` tolerance (rtol 1e-5, atol 1e-8) when not all are digit strings; for a return
  value, `==` after a tuple becomes a list, or `==` to the expected's first element, or a list of
  tuples as a list of lists;
- "lcb": LiveCodeBench's `grade_stdio` (stripped lines, equal one by one as text or as Decimal
  numbers) and `grade_call_based` (`==` after a tuple becomes a list);
- "exact": `==` after a tuple becomes a list.
Stdlib only.
"""

from __future__ import annotations

import math
from decimal import Decimal, InvalidOperation
from typing import Any

_RTOL = 1e-5
_ATOL = 1e-8


def stdout_matches(rule: str, output: str, expected: str) -> bool:
    """True if a program's stdout `output` is right by `rule` ("prime" or "lcb")."""
    if rule == "prime":
        return _prime_stdout(output, expected)
    if rule == "lcb":
        return _lcb_stdout(output, expected)
    raise ValueError(f"no stdout rule {rule!r}")


def value_matches(rule: str, value: Any, expected: Any) -> bool:
    """True if a function's return `value` is right by `rule` ("prime", "lcb" or "exact")."""
    if rule == "prime":
        return _prime_value(value, _prime_expected(expected))
    if rule in ("lcb", "exact"):
        return _same(list(value) if isinstance(value, tuple) else value, expected)
    raise ValueError(f"no value rule {rule!r}")


def _same(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except RecursionError:
        return False


def _prime_stdout(output: str, expected: str) -> bool:
    lines = output.splitlines()
    if "\n".join(lines).strip() == expected.strip():
        return True
    if "\n".join(line.strip() for line in lines).strip() == expected.strip():
        return True
    wanted = [line.strip() for line in expected.split("\n") if line]
    if lines == wanted:
        return True
    lines = [line for line in lines if line]
    if lines == wanted:
        return True
    return _prime_floats(lines, wanted)


def _digits(text: str) -> bool:
    return text.isdigit()


def _prime_floats(lines: list[str], wanted: list[str]) -> bool:
    """prime_code's numeric try: same line count, not every pair digit strings, each line one
    float, all close."""
    if len(lines) != len(wanted):
        return False
    if all(_digits(a) and _digits(b) for a, b in zip(lines, wanted, strict=True)):
        return False
    try:
        got = [float(line) for line in lines]
        want = [float(line) for line in wanted]
    except ValueError:
        return False
    return all(_close(a, b) for a, b in zip(got, want, strict=True))


def _close(a: float, b: float) -> bool:
    """numpy.isclose(a, b) with its defaults (equal infinities close, NaN never)."""
    if a == b:
        return True
    if math.isinf(a) or math.isinf(b) or math.isnan(a) or math.isnan(b):
        return False
    return abs(a - b) <= _ATOL + _RTOL * abs(b)


def _prime_expected(expected: Any) -> Any:
    """prime_code turns a dict's JSON string keys back into ints (wrapping it in a list)."""
    if isinstance(expected, dict):
        try:
            expected = [{int(k): v for k, v in expected.items()}]
        except (TypeError, ValueError):
            pass  # keys that are not numbers stay as they are, as in prime_code
    if isinstance(expected, list) and expected and isinstance(expected[0], dict):
        try:
            expected = [{int(k): v for k, v in expected[0].items()}]
        except (TypeError, ValueError):
            pass
    return expected


def _prime_value(value: Any, expected: Any) -> bool:
    if isinstance(value, tuple):
        value = list(value)
    if _same(value, expected):
        return True
    if isinstance(expected, list) and expected and _same(value, expected[0]):
        return True
    if isinstance(value, list) and value and isinstance(value[0], tuple):
        try:
            rows = [list(x) for x in value]
        except TypeError:
            return False  # an element that is not a sequence, as prime_code's except
        return _same(rows, _first(expected))
    return False


def _first(expected: Any) -> Any:
    try:
        return expected[0]
    except (TypeError, IndexError, KeyError):
        return _NOTHING


_NOTHING = object()  # equal to no value


def _lines(text: str) -> list[str]:
    return [line.strip() for line in text.strip().split("\n")]


def _decimals(line: str) -> list[Decimal] | None:
    try:
        return [Decimal(part) for part in line.split()]
    except InvalidOperation:
        return None


def _lcb_stdout(output: str, expected: str) -> bool:
    got, want = _lines(output), _lines(expected)
    if len(got) != len(want):
        return False
    for a, b in zip(got, want, strict=True):
        if a == b:
            continue
        da, db = _decimals(a), _decimals(b)
        if da is None or db is None or da != db:
            return False
    return True
