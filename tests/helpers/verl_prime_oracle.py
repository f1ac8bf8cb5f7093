"""Run verl 0.9.1's own prime_code `run_test` on cases given as JSON on stdin; print its results.

Run with envs/trl's python (verl is installed there). verl's `run_test` calls its
`reliability_guard()`, which disables os functions in the process that calls it: so each case runs
in a forked process of its own (as verl's `check_correctness` runs it in a multiprocessing
child), never in the test's. Input: a list of {"code", "in_outs"}; output: a list
of verl's per-test results (True, False, -1 runtime error, -2 compile error), one list per case.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path


def _load_run_test():
    """verl's own testing_util, loaded from its installed file: importing `verl` itself would
    import its trainer stack (seconds); this module needs only numpy."""
    spec = importlib.util.find_spec("verl")
    assert spec is not None and spec.origin is not None, "verl is not installed in this python"
    path = Path(spec.origin).parent / "utils/reward_score/prime_code/testing_util.py"
    module_spec = importlib.util.spec_from_file_location("verl_prime_testing_util", path)
    assert module_spec is not None and module_spec.loader is not None
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module.run_test


run_test = _load_run_test()


def _one(case: dict) -> list:
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        try:
            results, _ = run_test(in_outs=case["in_outs"], test=case["code"], timeout=5)
        except Exception:  # noqa: BLE001 (as verl's _temp_run: every test a runtime error)
            results = [-1 for _ in case["in_outs"]["inputs"]]
        answer = [r if isinstance(r, bool) else int(r) for r in results]
        os.write(write_end, json.dumps(answer).encode())
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        data = pipe.read()
    _, status = os.waitpid(pid, 0)
    if status != 0 or not data:
        raise RuntimeError(f"verl's run_test died on {case!r}: wait status {status}")
    return json.loads(data)


def main() -> None:
    cases = json.loads(sys.stdin.read())
    print(json.dumps([_one(case) for case in cases]))


if __name__ == "__main__":
    main()
