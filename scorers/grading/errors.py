"""The grading pool's errors, in a module of their own so the pool's parts can raise them too."""

from __future__ import annotations


class GradingPoolError(RuntimeError):
    """The pool cannot give a trustworthy outcome (worker death, IPC failure, batch cap)."""


class GradingTaskError(GradingPoolError):
    """`grade_fn` raised for one task; the batch is aborted but the pool stays usable.

    Kept distinct so a caller can turn a bad input (e.g. an unparsable gold
    answer) into a 4xx instead of tearing the pool down.
    """

    def __init__(
        self, message: str, *, task_index: int, remote_type: str, remote_text: str
    ) -> None:
        super().__init__(message)
        self.task_index = task_index
        self.remote_type = remote_type
        self.remote_text = remote_text
