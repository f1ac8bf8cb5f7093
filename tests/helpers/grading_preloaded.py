"""A module only a grading pool's preload imports: a worker that has it loaded was forked from a
process that ran the pool's preload (tests/scorers/test_grading_pool.py, the forkserver tests)."""

from __future__ import annotations

PRELOADED = True
