"""The driver that runs INSIDE the sandbox: every in-process test of one completion (function
calls and assert statements) in one interpreter, each under its own deadline.

Shipped into the sandbox as a file and run as `python -I harness.py`; stdlib only. It reads one
JSON payload on stdin (`nonce`, `code`, `prelude`, `setup`, `fn_name`, `solution_class`,
`load_s`, `per_test_s`, `tests`), then, before any of the code runs, keeps a private duplicate of
its stdout and points fds 0, 1 and 2 at /dev/null: what the code prints goes nowhere. It writes
its report on the private fd as lines `<nonce> <kind> <json>`: `loaded` or `load_error`, then for
each test `start` and `verdict`, then `done` (or `stop`, right after a verdict its watchdog
gave). The parent (`scorers.code_exec.report`) judges from those lines alone: a line without the
nonce is not the harness's, and a missing, duplicated or garbled report is a crash, never a pass.

Outcomes it reports: "ok" (returned; for a call test the parent compares the value, which it
gets in a tagged JSON form, never the expected value, which stays in the parent), "failed" (an
assert test raised AssertionError), "timeout" (the per-test ITIMER_REAL fired), "memory"
(MemoryError), "crash" (any other exception, SystemExit included: `sys.exit(0)` passes nothing).
`os._exit(0)`, a signal or a kill ends the process without a verdict: the parent reads that as
the outcome of the test in flight (crash, or the sandbox's timeout / memory status).

The limit of in-process protection: the code runs in this interpreter, so code written to attack
this harness can read the nonce from memory, write to the private fd, or monkeypatch what an
assert test calls. It can so forge an assert test's verdict (the expected values are in the
test's own source); it cannot forge a call test (the expected value never enters the sandbox) or
a stdin/stdout test (its own process, compared by the parent). Such forging only changes the
reward of that completion: the sandbox, not this harness, keeps the machine safe.
"""

from __future__ import annotations

import builtins
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

# bound before the code runs: the code replacing the module attributes does not reach these
_write = os.write
_dumps = json.dumps
_monotonic = time.monotonic
_setitimer = signal.setitimer
_signal = signal.signal
_exit = os._exit
_MAX_DEPTH = 100
# how long past its deadline a test may hold out against the timer (a bare `except:` around a
# loop) before the watchdog thread reports it timed out and ends the run
WATCHDOG_GRACE_S = 0.5
_DETAIL_CHARS = 400


class _Deadline(BaseException):
    """The per-test timer fired (a BaseException: the code's `except Exception` does not eat it;
    a bare `except:` does, and the sandbox's wall deadline ends the run instead)."""


def _on_alarm(signum: int, frame: Any) -> None:
    raise _Deadline()


class Reporter:
    """Writes the framed report on the fd the code cannot see by accident; one writer at a time
    (the main thread or the watchdog), so no verdict is written twice."""

    def __init__(self, fd: int, nonce: str) -> None:
        self.fd = fd
        self.prefix = nonce + " "
        self.cond = threading.Condition()
        self.watched: tuple[Any, float, float] | None = None  # (test index or "load", until, s)

    def frame(self, kind: str, body: dict[str, Any]) -> None:
        data = (self.prefix + kind + " " + _dumps(body) + "\n").encode("ascii")
        view = memoryview(data)
        with self.cond:
            while view:
                view = view[_write(self.fd, view) :]

    def watch(self, what: Any, seconds: float) -> None:
        with self.cond:
            self.watched = (what, _monotonic() + seconds + WATCHDOG_GRACE_S, seconds)
            self.cond.notify()

    def settle(self, kind: str, body: dict[str, Any]) -> None:
        """The verdict of what is watched, unless the watchdog already gave it."""
        with self.cond:
            self.watched = None
            self.frame(kind, body)

    def watchdog(self) -> None:
        """A daemon thread: what holds out past its deadline and grace is reported timed out,
        then the run ends (the parent runs the tests left in a fresh sandbox)."""
        with self.cond:
            while True:
                if self.watched is None:
                    self.cond.wait()
                    continue
                what, until, seconds = self.watched
                left = until - _monotonic()
                if left > 0:
                    self.cond.wait(left)
                    continue
                detail = f"past the deadline of {seconds:g} s, holding out against its timer"
                if what == "load":
                    self.frame("load_error", {"outcome": "timeout", "detail": detail})
                else:
                    body = {"i": what, "outcome": "timeout", "detail": detail, "wall_s": seconds}
                    self.frame("verdict", body)
                    self.frame("stop", {"reason": "watchdog"})
                _exit(0)


def _hide_stdio() -> int:
    """A private duplicate of stdout for the report; fds 0, 1, 2 on /dev/null for the code."""
    private = os.dup(1)  # not inheritable: a process the code starts does not get it
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(null)
    return private


def _describe(exc: BaseException) -> str:
    name = type(exc).__name__
    try:
        text = str(exc)
    except BaseException:  # noqa: BLE001 (the code's own __str__ may raise anything)
        text = "<unprintable>"
    return f"{name}: {text}"[:_DETAIL_CHARS] if text else name


def _judged(exc: BaseException, seconds: float) -> tuple[str, str]:
    if isinstance(exc, _Deadline):
        return "timeout", f"past the per-test deadline of {seconds:g} s"
    if isinstance(exc, MemoryError):
        return "memory", _describe(exc)
    if isinstance(exc, AssertionError):
        return "failed", _describe(exc)
    if isinstance(exc, SystemExit):
        return "crash", f"the code called exit({exc.code!r:.40})"
    return "crash", _describe(exc)


def run_timed(seconds: float, work: Callable[[], Any]) -> tuple[str, str, Any]:
    """(outcome, detail, value) of `work()` under an ITIMER_REAL of `seconds`."""
    _signal(signal.SIGALRM, _on_alarm)  # again each time: the code may have replaced it
    try:
        try:
            _setitimer(signal.ITIMER_REAL, seconds)
            value = work()
        finally:
            _setitimer(signal.ITIMER_REAL, 0)
    except BaseException as exc:  # noqa: BLE001 (everything the code raises is its verdict)
        outcome, detail = _judged(exc, seconds)
        return outcome, detail, None
    return "ok", "", value


def encode(value: Any, depth: int = 0) -> Any:
    """A return value as tagged JSON the parent rebuilds exactly: containers as ["L"|"T"|"D", ...],
    subclasses as their base type (a custom __eq__ cannot reach the parent's comparison)."""
    if depth > _MAX_DEPTH:
        raise ValueError(f"the return value nests deeper than {_MAX_DEPTH}")
    if value is None or type(value) in (bool, int, float, str):
        return value
    for base in (int, float, str):
        if isinstance(value, base):
            return base(value)
    if isinstance(value, (list, tuple)):
        items = list.__iter__(value) if isinstance(value, list) else tuple.__iter__(value)
        tag = "L" if isinstance(value, list) else "T"
        return [tag, [encode(item, depth + 1) for item in items]]
    if isinstance(value, dict):
        pairs = dict.items(value)
        return ["D", [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in pairs]]
    raise TypeError(f"a return value of type {type(value).__name__} is not plain data")


def _prime_keys(args: list[Any]) -> list[Any]:
    """prime_code's quirk: a dict first argument gets int keys and becomes the only argument."""
    if args and isinstance(args[0], dict):
        try:
            return [{int(k): v for k, v in args[0].items()}]
        except (TypeError, ValueError):
            return args
    return args


def _load(payload: dict[str, Any]) -> tuple[dict[str, Any], Any]:
    namespace: dict[str, Any] = {"__name__": "solution", "__builtins__": builtins}
    code = payload["code"]
    if payload["prelude"]:
        exec(compile(payload["prelude"], "<prelude>", "exec"), namespace)
    exec(compile(code, "<solution>", "exec"), namespace)
    if payload["setup"]:
        exec(compile(payload["setup"], "<setup>", "exec"), namespace)
    fn_name = payload["fn_name"]
    if fn_name is None:
        return namespace, None
    if payload["solution_class"] and "class Solution" in code:
        return namespace, getattr(namespace["Solution"](), fn_name)
    if fn_name not in namespace:
        raise NameError(f"the code defines no function {fn_name!r}")
    return namespace, namespace[fn_name]


def _test_work(test: dict[str, Any], namespace: dict[str, Any], fn: Any) -> Callable[[], Any]:
    if test["kind"] == "assert":
        return lambda: exec(compile(test["source"], f"<test {test['i']}>", "exec"), namespace)
    args = _prime_keys(test["args"]) if test.get("prime_keys") else test["args"]
    kwargs = test.get("kwargs") or {}

    def call() -> Any:
        value = fn(*args, **kwargs)
        _dumps(value)  # prime_code fails a value json.dumps refuses
        return encode(value)

    return call


def run_tests(payload: dict[str, Any], report: Reporter) -> None:
    threading.Thread(target=report.watchdog, name="harness-watchdog", daemon=True).start()
    report.watch("load", payload["load_s"])
    outcome, detail, loaded = run_timed(payload["load_s"], lambda: _load(payload))
    if outcome != "ok":
        report.settle("load_error", {"outcome": outcome, "detail": detail})
        return
    report.settle("loaded", {})
    namespace, fn = loaded
    seconds = payload["per_test_s"]
    for test in payload["tests"]:
        report.frame("start", {"i": test["i"]})
        began = _monotonic()
        report.watch(test["i"], seconds)
        outcome, detail, value = run_timed(seconds, _test_work(test, namespace, fn))
        if outcome == "ok" and test["kind"] == "assert":
            outcome = "passed"
        body = {"i": test["i"], "outcome": outcome, "detail": detail}
        body["wall_s"] = round(_monotonic() - began, 6)
        if test["kind"] == "call" and outcome == "ok":
            body["output"] = value
        report.settle("verdict", body)
    report.frame("done", {"n": len(payload["tests"])})


def main() -> None:
    payload = json.loads(sys.stdin.buffer.read())
    report = Reporter(_hide_stdio(), payload["nonce"])
    run_tests(payload, report)
    _exit(0)  # no atexit hook, thread or finaliser of the code runs after the report


if __name__ == "__main__":
    main()
