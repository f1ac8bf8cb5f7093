"""One math_verify comparison, run inside a GradingPool worker.

`math_verify` is imported at module top because this module is preloaded into
the forkserver: workers fork with it already imported. math_verify's own
signal.alarm timeouts are disabled; the pool's SIGKILL is the one timeout
authority (an alarm can't interrupt C code, and two timeouts would race).
"""
from __future__ import annotations

import logging

from math_verify import parse, verify


class UnparsableGoldError(ValueError):
    """The gold answer parses to nothing: a dataset bug, not a wrong answer."""


class _DropTimeoutDisabledWarning(logging.Filter):
    """We disable math_verify's timeouts on purpose; its warning about that is noise."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Timeout is disabled" not in record.getMessage()


for _name in ("math_verify.parser", "math_verify.grader"):
    logging.getLogger(_name).addFilter(_DropTimeoutDisabledWarning())


_DELIMITERS = ("$", "\\boxed", "\\(", "\\[")


def parse_gold(gold: str) -> list:
    """Parse the gold answer; refuse a gold that parses to nothing.

    A bare gold (a dataset answer such as `2\\sqrt{2}`, with no `$` or `\\boxed`) is
    parsed as `\\boxed{gold}` first: parsed raw, math_verify finds no LaTeX and
    extracts the leading `2`, so `\\boxed{2}` would be graded correct.
    """
    candidates = [gold] if any(d in gold for d in _DELIMITERS) else ["\\boxed{" + gold + "}", gold]
    parsed: list = []
    for text in candidates + ["$" + gold + "$"]:
        parsed = parse(text, parsing_timeout=None)
        if parsed:
            break
    if not parsed:
        raise UnparsableGoldError(f"gold answer {gold[:200]!r} cannot be parsed by math_verify")
    return parsed


def grade(prediction: str, gold: str, float_rounding: int, numeric_precision: int, strict: bool) -> float:
    """1.0 if the prediction's answer equals the gold answer, else 0.0 (unparsable -> 0.0)."""
    if not isinstance(prediction, str) or not isinstance(gold, str):
        raise TypeError(
            f"prediction and gold must be str, got {type(prediction).__name__} and {type(gold).__name__}"
        )
    gold_parsed = parse_gold(gold)
    pred_parsed = parse(prediction, parsing_timeout=None)
    ok = verify(
        gold_parsed,
        pred_parsed,
        float_rounding=float_rounding,
        numeric_precision=numeric_precision,
        strict=strict,
        timeout_seconds=None,
    )
    return 1.0 if ok else 0.0
