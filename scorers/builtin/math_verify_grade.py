"""One math_verify comparison, run inside a GradingPool worker.

`math_verify` is imported at module top because this module is preloaded into
the forkserver: workers fork with it already imported. math_verify's own
signal.alarm timeouts are disabled; the pool's SIGKILL is the one timeout
authority (an alarm can't interrupt C code, and two timeouts would race).
"""

from __future__ import annotations

import logging
import re

from math_verify import parse, verify


class UnparsableGoldError(ValueError):
    """The gold answer parses to nothing: a dataset bug, not a wrong answer."""


class _DropTimeoutDisabledWarning(logging.Filter):
    """We disable math_verify's timeouts on purpose; its warning about that is noise."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Timeout is disabled" not in record.getMessage()


class _MemoryErrorSeen(logging.Filter):
    """math_verify catches every exception, MemoryError too, and returns "no answer" or "not
    equal": its debug records are the only trace. This notes a MemoryError among them (so `grade`
    can say the item passed the worker's memory cap) and drops every debug record."""

    seen = False

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.INFO:
            return True
        if record.exc_info and isinstance(record.exc_info[1], MemoryError):
            _MemoryErrorSeen.seen = True
        return False


for _name in ("math_verify.parser", "math_verify.grader"):
    _logger = logging.getLogger(_name)
    _logger.addFilter(_DropTimeoutDisabledWarning())
    _logger.addFilter(_MemoryErrorSeen())
    _logger.setLevel(logging.DEBUG)  # its debug records reach the filter, which drops them


_DELIMITERS = ("$", "\\boxed", "\\(", "\\[")
# One number in math_verify's own plain-number grammar: `-`, digit groups of 3 split by `,` or a
# space, one `.`/`,` decimal (or a bare `.5`), an optional `%`, an optional sentence-final `.`.
_PLAIN_NUMBER = re.compile(
    r"(?:-?(?:[1-9]\d{0,2}(?:[ ,]\d{3})+(?:\.\d+)?|\d+(?:[.,]\d+)?)|\.\d+)(?:\s*%)?\.?", re.ASCII
)  # ASCII digits only: math_verify reads `１２` (fullwidth) only inside \boxed{}


def _is_plain_number(gold: str) -> bool:
    # `match`, not `fullmatch`: like math_verify, take the first alternative that fits, so a gold
    # it reads only in part (`1,2345` -> 1234) is not plain.
    m = _PLAIN_NUMBER.match(gold)
    return m is not None and m.end() == len(gold)


def parse_gold(gold: str) -> list:
    """Parse the gold answer; refuse a gold that parses to nothing.

    A plain number is parsed as math_verify's default parses it, so it grades as math_verify
    grades it: `1,22` -> 1.22, `1,000` and `1 000` -> 1000 (`\\boxed{1,22}` would be the set
    {1, 22}; a list needs a space, `1, 2`). Any other bare gold (no `$` or `\\boxed`, e.g.
    `2\\sqrt{2}`) is parsed as `\\boxed{gold}` first: parsed raw, math_verify finds no LaTeX
    and extracts the leading `2`. `+2` and `10\\%` stay on that path (raw, math_verify reads
    them as nothing and as 10).
    """
    gold = gold.strip()
    if any(d in gold for d in _DELIMITERS):
        candidates = [gold]
    elif _is_plain_number(gold):
        # the box only if math_verify reads nothing raw
        candidates = [gold, "\\boxed{" + gold + "}"]
    else:
        candidates = ["\\boxed{" + gold + "}", gold]
    parsed: list = []
    for text in candidates + ["$" + gold + "$"]:
        parsed = parse(text, parsing_timeout=None)
        if parsed:
            break
    if not parsed:
        raise UnparsableGoldError(f"gold answer {gold[:200]!r} cannot be parsed by math_verify")
    return parsed


def grade(
    prediction: str, gold: str, float_rounding: int, numeric_precision: int, strict: bool
) -> float:
    """1.0 if the prediction's answer equals the gold answer, else 0.0 (unparsable -> 0.0)."""
    if not isinstance(prediction, str) or not isinstance(gold, str):
        raise TypeError(
            f"prediction and gold must be str, got {type(prediction).__name__} and "
            f"{type(gold).__name__}"
        )
    _MemoryErrorSeen.seen = False
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
    if _MemoryErrorSeen.seen:  # the verdict came from a computation cut short by the memory cap
        raise MemoryError("math_verify ran out of memory and caught it")
    return 1.0 if ok else 0.0
