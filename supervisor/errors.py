"""Typed failures. Where a child is involved, each one carries its failure record."""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from child_runtime.exit_codes import describe, signal_name


@dataclass(frozen=True)
class ChildRecord:
    """Who the child was and how it ended: enough to debug without reproducing."""

    name: str
    pid: int | None
    returncode: int | None = None
    log_path: str | None = None
    log_tail: str = ""
    at: float = field(default_factory=time.time)

    @property
    def exit_status(self) -> str:
        return describe(self.returncode)

    @property
    def signal_name(self) -> str | None:
        if self.returncode is not None and self.returncode < 0:
            return signal_name(-self.returncode)
        return None

    @property
    def exitcode(self) -> int | None:
        if self.returncode is not None and self.returncode >= 0:
            return self.returncode
        return None

    def render(self) -> str:
        tail = self.log_tail.rstrip()
        lines = [f"child {self.name!r} pid={self.pid} status={self.exit_status} log={self.log_path}"]
        if tail:
            lines.append("--- log tail ---\n" + tail)
        return "\n".join(lines)


class ScorerError(RuntimeError):
    """Base of every managed-scorers failure; `record` is set where a child is involved."""

    def __init__(self, message: str, record: ChildRecord | None = None) -> None:
        self.record = record
        super().__init__(message if record is None else f"{message}\n{record.render()}")

    @property
    def pid(self) -> int | None:
        return self.record.pid if self.record else None

    @property
    def returncode(self) -> int | None:
        return self.record.returncode if self.record else None

    @property
    def signal_name(self) -> str | None:
        return self.record.signal_name if self.record else None

    @property
    def log_tail(self) -> str:
        return self.record.log_tail if self.record else ""


class ScorerStartupError(ScorerError):
    """The child did not become ready: it exited, timed out, or reported a boot failure."""


class ScorerProcessDied(ScorerError):
    """The child is gone (crash, kill, OOM) while it was expected to serve."""


class ScorerCrashLoop(ScorerProcessDied):
    """The child kept dying: more restarts in the policy window than it allows."""


class ScorerTimeout(ScorerError):
    """A call passed its deadline; the child was killed because its state is unknown."""


class ScorerRequestError(ScorerError):
    """The child answered with an error status (bad input, scorer exception, conflict)."""

    def __init__(self, message: str, record: ChildRecord | None = None, status: int | None = None,
                 kind: str | None = None) -> None:
        self.status = status
        self.kind = kind
        super().__init__(message, record)


class ScorerUnavailable(ScorerError):
    """A remote scorer server cannot be reached (refused, reset, DNS)."""


class RewardContractError(ScorerError):
    """Rewards broke the contract: wrong ids or order, wrong count, non-finite, missing term."""


class ConfigError(ValueError):
    """A configuration cannot work (e.g. several GPUs for one child)."""
