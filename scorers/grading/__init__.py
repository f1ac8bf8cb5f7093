"""The math grading pool: graders run in forkserver-started worker processes, one item at a time,
SIGKILLed at their deadline or memory budget, replaced from a warm template.

May import: the stdlib, `scorers.grading.processes`. Nothing of `child_runtime` or `supervisor`.
"""
