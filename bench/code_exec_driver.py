"""Runs in envs/trl (verl 0.9.1): verl's own `prime_code.compute_score` on the code_exec line's
tasks, serially, as verl's reward loop calls it. Printed as one JSON line; bench/code_exec.py
makes the line of `make bench` from it.

`python -m bench.code_exec_driver TASKS_JSON`: a file holding `[[completion, tests], ...]`. Each
task is graded as `default_compute_score` does for `codecontests`/`apps`/`taco`:
`prime_code.compute_score(completion, json.dumps(tests), continuous=True)`, one after another
(verl's naive reward manager: one call per item, in its loop). prime_code is loaded from verl's
install by its path, without `import verl`: verl's package import pulls in torch and takes 25-30 s
on the 2-core VM, which the bench cannot afford per smoke run; the grading code is the same file,
and it forks its checker processes from a smaller parent (if anything, in verl's favour). The
first task is graded once before the clock starts (its first fork and imports). Stdlib only here:
prime_code brings its own numpy.
"""

from __future__ import annotations

import importlib.util
import json
import resource
import sys
import time
from pathlib import Path
from types import ModuleType


def prime_code() -> ModuleType:
    """verl's `verl.utils.reward_score.prime_code` package, loaded as `prime_code` by path."""
    verl = importlib.util.find_spec("verl")  # finds the package, runs nothing of it
    if verl is None or not verl.submodule_search_locations:
        raise RuntimeError(f"verl is not installed in {sys.prefix}")
    folder = (
        Path(list(verl.submodule_search_locations)[0]) / "utils" / "reward_score" / "prime_code"
    )
    spec = importlib.util.spec_from_file_location(
        "prime_code", folder / "__init__.py", submodule_search_locations=[str(folder)]
    )
    if spec is None or spec.loader is None:
        raise RuntimeError(f"cannot load verl's prime_code from {folder}")
    module = importlib.util.module_from_spec(spec)
    sys.modules["prime_code"] = module
    spec.loader.exec_module(module)
    return module


def cpu_here() -> float:
    """CPU seconds of this process and its reaped children (prime_code's checker processes)."""
    own, reaped = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    return own.ru_utime + own.ru_stime + reaped.ru_utime + reaped.ru_stime


def main() -> None:
    tasks = json.loads(Path(sys.argv[1]).read_text())
    grader = prime_code()
    grader.compute_score(tasks[0][0], json.dumps(tasks[0][1]), continuous=True)  # warm
    scores = []
    started, cpu = time.perf_counter(), cpu_here()
    for completion, tests in tasks:
        success, _ = grader.compute_score(completion, json.dumps(tests), continuous=True)
        scores.append(float(success))
    seconds, cpu = time.perf_counter() - started, cpu_here() - cpu
    print(json.dumps({"seconds": seconds, "cpu": cpu, "scores": scores}), flush=True)


if __name__ == "__main__":
    main()
