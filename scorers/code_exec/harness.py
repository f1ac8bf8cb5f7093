"""The driver that runs INSIDE the sandbox: every in-process test of one completion (function
calls and assert statements) in one interpreter, each under its own deadline; or (`programs`)
every stdin/stdout test of it, the program compiled once and each run in a forked child whose
stdout the harness reports.

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
import io
import json
import os
import selectors
import signal
import sys
import threading
import time
import types
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
_MEMORY_EXIT = (
    86  # a program's exit status for its MemoryError (one of its own exits is a crash too)
)


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
        self.written = 0

    def frame(self, kind: str, body: dict[str, Any]) -> None:
        data = (self.prefix + kind + " " + _dumps(body) + "\n").encode("ascii")
        view = memoryview(data)
        with self.cond:
            self.written += len(data)
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


# --- stdin/stdout programs: each test a forked child of this harness, the harness runs no code ---


def _exit_status(exc: SystemExit) -> int:
    """The status `python solution.py` exits with on this SystemExit."""
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code & 0xFF
    return 1  # a message: printed to stderr by python, status 1


def _run_main(code: Any) -> int:
    """The program as `__main__`, then its non-daemon threads (python waits for them at exit)."""
    main = types.ModuleType("__main__")
    main.__dict__["__builtins__"] = builtins
    sys.modules["__main__"] = main
    sys.argv = ["solution.py"]
    try:
        exec(code, main.__dict__)
        for thread in threading.enumerate():
            if thread is not threading.current_thread() and not thread.daemon:
                thread.join()
        status = 0
    except SystemExit as exc:
        status = _exit_status(exc)
    except MemoryError:
        status = _MEMORY_EXIT
    except BaseException:  # noqa: BLE001 (the program's uncaught error is its exit status 1)
        status = 1
    try:
        if not sys.stdout.closed:  # python itself lets a program close its stdout
            sys.stdout.flush()
    except BaseException:  # noqa: BLE001 (output it could not write: python exits 120)
        status = status or 120
    return status


def _child(code: Any, stdin_fd: int, out_fd: int, private: tuple[int, ...]) -> None:
    """In the forked child: the test's input on fd 0, fd 1 to the harness, fd 2 to /dev/null,
    the report's fds closed, a process group of its own; never returns."""
    status = 70
    try:
        os.setpgid(0, 0)
        null = os.open(os.devnull, os.O_WRONLY)
        for fd, target in ((stdin_fd, 0), (out_fd, 1), (null, 2)):
            os.dup2(fd, target)
        for fd in (stdin_fd, out_fd, null, *private):
            os.close(fd)
        _setitimer(signal.ITIMER_REAL, 0)
        _signal(signal.SIGALRM, signal.SIG_DFL)
        stdin = io.BufferedReader(io.FileIO(0, "r", closefd=False))
        sys.stdin = io.TextIOWrapper(stdin, encoding="utf-8")
        stdout = io.BufferedWriter(io.FileIO(1, "w", closefd=False))
        sys.stdout = io.TextIOWrapper(stdout, encoding="utf-8")
        sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), write_through=True)
        status = _run_main(code)
    finally:
        _exit(status)


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass  # the group is empty


def _collect(out_fd: int, pid: int, until: float, cap: int) -> tuple[bytes, str]:
    """The child's stdout until it has closed and the child has exited; (stdout, "" | "timeout" |
    "output"). Its exit (a pidfd) kills what it left in its group, so the pipe closes."""
    got = bytearray()
    pidfd = os.pidfd_open(pid)
    sel = selectors.DefaultSelector()
    sel.register(out_fd, selectors.EVENT_READ)
    sel.register(pidfd, selectors.EVENT_READ)
    try:
        while len(sel.get_map()) > 0:
            left = until - _monotonic()
            if left <= 0:
                return bytes(got), "timeout"
            for key, _ in sel.select(left):
                if key.fd == pidfd:
                    sel.unregister(pidfd)
                    _kill_group(pid)
                    continue
                chunk = os.read(out_fd, 1 << 16)
                if not chunk:
                    sel.unregister(out_fd)
                got += chunk
                if len(got) > cap:
                    return bytes(got[:cap]), "output"
        return bytes(got), ""
    finally:
        sel.close()
        os.close(pidfd)


def _program_outcome(status: int, stopped: str, seconds: float, cap: int) -> tuple[str, str]:
    if stopped == "timeout":
        return "timeout", f"past the per-test deadline of {seconds:g} s"
    if stopped == "output":
        return "crash", f"wrote more than {cap} bytes"
    if os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        if number == signal.SIGXCPU:
            return "timeout", "past the CPU bound"
        return "crash", f"killed by {signal.Signals(number).name}"
    code = os.waitstatus_to_exitcode(status)
    if code == _MEMORY_EXIT:
        return "memory", "MemoryError"
    return ("ok", "") if code == 0 else ("crash", f"exit {code}")


def run_program(
    code: Any, stdin: str, seconds: float, cap: int, private: int
) -> tuple[str, str, Any]:
    """(outcome, detail, stdout text) of one run of the program, in a forked child."""
    stdin_fd = os.memfd_create("stdin")
    data = memoryview(stdin.encode("utf-8"))
    while data:
        data = data[os.write(stdin_fd, data) :]
    os.lseek(stdin_fd, 0, os.SEEK_SET)
    out_read, out_write = os.pipe()
    pid = os.fork()
    if pid == 0:
        _child(code, stdin_fd, out_write, (out_read, private))
    try:
        os.setpgid(pid, pid)  # as the child does: whichever runs first, the group exists
    except OSError:
        pass  # the child already made it, or already exited
    os.close(stdin_fd)
    os.close(out_write)
    try:
        output, stopped = _collect(out_read, pid, _monotonic() + seconds, cap)
    finally:
        os.close(out_read)
        _kill_group(pid)
        _, status = os.waitpid(pid, 0)
    outcome, detail = _program_outcome(status, stopped, seconds, cap)
    return outcome, detail, output.decode("utf-8", "replace") if outcome == "ok" else None


def run_programs(payload: dict[str, Any], report: Reporter) -> None:
    """Every stdin/stdout test of the payload, the program compiled once, each run forked."""
    source = payload["prelude"] + payload["code"]

    def load() -> Any:
        if payload["prelude"]:  # the prelude's imports once, here: each child finds them loaded
            exec(compile(payload["prelude"], "<prelude>", "exec"), {"__builtins__": builtins})
        return compile(source, "solution.py", "exec")

    outcome, detail, code = run_timed(payload["load_s"], load)
    if outcome != "ok":
        report.settle("load_error", {"outcome": outcome, "detail": detail})
        return
    report.settle("loaded", {})
    for test in payload["tests"]:
        report.frame("start", {"i": test["i"]})
        began = _monotonic()
        outcome, detail, output = run_program(
            code, test["stdin"], payload["per_test_s"], payload["output_cap"], report.fd
        )
        body = {"i": test["i"], "outcome": outcome, "detail": detail}
        body |= {"wall_s": round(_monotonic() - began, 6)}
        if outcome == "ok":
            body["output"] = output
        report.settle("verdict", body)
        if report.written > payload["report_bytes"] and test is not payload["tests"][-1]:
            report.frame("stop", {"reason": "report size"})  # the rest in a fresh run
            return
    report.frame("done", {"n": len(payload["tests"])})


def main() -> None:
    payload = json.loads(sys.stdin.buffer.read())
    report = Reporter(_hide_stdio(), payload["nonce"])
    if payload.get("programs"):
        run_programs(payload, report)
    else:
        run_tests(payload, report)
    _exit(0)  # no atexit hook, thread or finaliser of the code runs after the report


if __name__ == "__main__":
    main()
