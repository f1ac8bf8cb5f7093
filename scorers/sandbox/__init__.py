"""Run one untrusted program in a fresh sandbox (bubblewrap) and answer a typed result.

`probe(python)` at boot (raises `SandboxUnavailable`, never a silent fallback);
`run_sandboxed(argv, python=..., stdin=..., files=..., limits=Limits(...))` -> `RunResult`.
docs/reliability.md ("Sandboxed code") says what each layer holds and what was observed.
"""

from scorers.sandbox.probe import probe
from scorers.sandbox.results import (
    STATUSES,
    Limits,
    RunResult,
    SandboxStuck,
    SandboxUnavailable,
)
from scorers.sandbox.run import run_sandboxed

__all__ = [
    "STATUSES",
    "Limits",
    "RunResult",
    "SandboxStuck",
    "SandboxUnavailable",
    "probe",
    "run_sandboxed",
]
