"""What a math_verify child starts before its own imports: the grading forkserver, preloading
math_verify and the warm-up (the slow part of the child's start, about 0.7 CPU-s), so that it runs
on the other core while the child imports its server. Stdlib only until the launch: the child calls
this first (see scorers/early.py); the pool that load() starts then finds it running and owns it."""

from __future__ import annotations

GRADE_FN = "scorers.builtin.math_verify_grade:grade"
# preloaded: workers fork from a warmed-up forkserver
WARM_MODULE = "scorers.builtin.math_verify_warm"
PRELOAD = ("math_verify", WARM_MODULE)


def start_early() -> None:
    from scorers.grading.mp_helpers import forkserver_modules, start_forkserver_early

    start_forkserver_early(forkserver_modules(PRELOAD, GRADE_FN))
