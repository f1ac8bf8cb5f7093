"""The parent's reading of the harness's report (see `harness.py` for the frames).

Only lines that start with this run's nonce are the harness's; they must come in the one order
the harness writes them (`loaded` | `load_error`, then `start i` / `verdict i` for the run's tests
in order, then `done`, or `stop` right after a verdict). Anything else makes the report `broken`,
and the grader then fails every test of the run as a crash: a forged or garbled report never
passes a test. An unterminated last line is a frame the harness did not finish (it was killed
while writing): it is not read.
Stdlib only.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from scorers.code_exec.cases import AssertTest, CallTest, StdioTest
from scorers.code_exec.compare import stdout_matches, value_matches
from scorers.code_exec.verdicts import Outcome, TestVerdict

_OUTCOMES = {"ok", "passed", "failed", "timeout", "memory", "crash"}
_DETAIL_CHARS = 400


class BrokenReport(ValueError):
    """The report is not the harness's own, in order and well formed."""


@dataclass
class HarnessReport:
    """What the harness said in one run: loaded or why not, the test in flight, the verdicts
    (raw bodies by test index), whether it got to the end."""

    loaded: bool = False
    load_error: dict[str, Any] | None = None
    in_flight: int | None = None
    verdicts: dict[int, dict[str, Any]] = field(default_factory=dict)
    done: bool = False
    stopped: bool = False  # the harness's watchdog ended the run after a test's timeout
    broken: str | None = None


def _frames(stdout: bytes, nonce: str) -> list[tuple[str, Any]]:
    prefix = (nonce + " ").encode("ascii")
    complete = stdout[: stdout.rfind(b"\n") + 1]  # an unterminated last line was never finished
    frames = []
    for line in complete.split(b"\n"):
        if not line.startswith(prefix):
            continue
        kind, _, body = line[len(prefix) :].partition(b" ")
        try:
            value = json.loads(body)
        except (ValueError, RecursionError) as exc:  # RecursionError: nesting past the parser
            raise BrokenReport(f"a garbled {kind[:20]!r} frame: {exc}") from exc
        if not isinstance(value, dict):
            raise BrokenReport(f"a {kind[:20]!r} frame whose body is not an object")
        frames.append((kind.decode("ascii", "replace"), value))
    return frames


def _step(report: HarnessReport, kind: str, body: dict[str, Any], order: Sequence[int]) -> None:
    """Take one frame, or raise BrokenReport if it is not the one the harness writes next."""
    following = order[len(report.verdicts)] if len(report.verdicts) < len(order) else None
    index = body.get("i")
    if index is not None and type(index) is not int:
        raise BrokenReport(f"a {kind!r} frame whose test index is not an int")
    if report.done or report.stopped or report.load_error is not None:
        raise BrokenReport(f"a {kind!r} frame after the report ended")
    if not report.loaded:
        if kind == "loaded":
            report.loaded = True
        elif kind == "load_error":
            report.load_error = body
        else:
            raise BrokenReport(f"a {kind!r} frame before the code loaded")
    elif kind == "start" and report.in_flight is None and body.get("i") == following:
        report.in_flight = following
    elif kind == "verdict" and report.in_flight is not None and body.get("i") == report.in_flight:
        report.verdicts[report.in_flight] = body
        report.in_flight = None
    elif kind == "stop" and report.verdicts and report.in_flight is None:
        report.stopped = True
    elif kind == "done" and following is None and report.in_flight is None:
        report.done = body.get("n") == len(order)
        if not report.done:
            raise BrokenReport(f"done after {body.get('n')!r} tests, the run had {len(order)}")
    else:
        raise BrokenReport(f"an unexpected {kind!r} frame (test {body.get('i')!r:.20})")


def read_report(stdout: bytes, nonce: str, order: Sequence[int]) -> HarnessReport:
    """The report of one harness run over the tests `order` (their indices, in run order)."""
    report = HarnessReport()
    try:
        for kind, body in _frames(stdout, nonce):
            _step(report, kind, body, order)
    except BrokenReport as exc:
        report.broken = str(exc)
    return report


def decode(value: Any, depth: int = 0) -> Any:
    """The harness's tagged JSON back into the value it encoded (tuples and int keys kept)."""
    if depth > 200:
        raise BrokenReport("a return value nested deeper than the harness encodes")
    if not isinstance(value, list):
        return value
    if len(value) != 2 or value[0] not in ("L", "T", "D") or not isinstance(value[1], list):
        raise BrokenReport(f"a return value with a bad tag {str(value)[:40]!r}")
    tag, items = value
    if tag == "L":
        return [decode(item, depth + 1) for item in items]
    if tag == "T":
        return tuple(decode(item, depth + 1) for item in items)
    try:
        return {decode(k, depth + 1): decode(v, depth + 1) for k, v in items}
    except (TypeError, ValueError) as exc:
        raise BrokenReport(f"a dict return value that does not rebuild: {exc}") from exc


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


def _answered(index: int, test: CallTest | StdioTest, body: dict[str, Any]) -> TestVerdict:
    """A test that ran to its end: the value or the stdout judged here, by its rule."""
    if "output" not in body:
        raise BrokenReport(f"test {index}: a verdict without its output")
    wall = float(body["wall_s"])
    if isinstance(test, StdioTest):
        output = body["output"]
        if not isinstance(output, str):
            raise BrokenReport(f"test {index}: a program's output that is not text")
        if stdout_matches(test.rule, output, test.expected):
            return TestVerdict(index, Outcome.PASSED, "", wall)
        return TestVerdict(index, Outcome.FAILED, "wrong output: " + output[:200], wall)
    value = decode(body["output"])
    if value_matches(test.rule, value, test.expected):
        return TestVerdict(index, Outcome.PASSED, "", wall)
    detail = f"wrong answer: returned {_short(value)}, expected {_short(test.expected)}"
    return TestVerdict(index, Outcome.FAILED, detail, wall)


def verdict_of(
    index: int, test: CallTest | AssertTest | StdioTest, body: dict[str, Any]
) -> TestVerdict:
    """One test's verdict from the harness's body."""
    outcome, detail = body.get("outcome"), body.get("detail", "")
    wall = body.get("wall_s")
    if outcome not in _OUTCOMES or not isinstance(detail, str):
        raise BrokenReport(f"test {index}: a verdict with outcome {outcome!r:.20}")
    if not (isinstance(wall, (int, float)) and math.isfinite(wall)):
        raise BrokenReport(f"test {index}: a verdict without its time")
    if (outcome == "ok") == isinstance(test, AssertTest) and outcome in ("ok", "passed"):
        raise BrokenReport(f"test {index}: {outcome!r} is not an outcome of this kind of test")
    if outcome == "ok":
        assert not isinstance(test, AssertTest)
        return _answered(index, test, body)
    if outcome == "failed" and not isinstance(test, AssertTest):
        outcome = "crash"  # an AssertionError the function raised is its error, not a wrong answer
    return TestVerdict(index, Outcome(outcome), detail[:_DETAIL_CHARS], float(wall))
