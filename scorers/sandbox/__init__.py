"""Run one untrusted program in a fresh sandbox (bubblewrap) and answer a typed result.

`probe(python)` at boot (raises `SandboxUnavailable`, never a silent fallback);
`run_sandboxed(argv, python=..., stdin=..., files=..., limits=Limits(...))` -> `RunResult`;
`prepare(python, limits)` starts one ahead (`PreparedSandbox.run(argv, stdin=, files=)` later);
`WarmSandboxes(python, size)` keeps `size` prepared, a Runner like this module.
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
from scorers.sandbox.run import PreparedSandbox, prepare, run_sandboxed
from scorers.sandbox.warm import WarmSandboxes

__all__ = [
    "STATUSES",
    "Limits",
    "PreparedSandbox",
    "RunResult",
    "SandboxStuck",
    "SandboxUnavailable",
    "WarmSandboxes",
    "prepare",
    "probe",
    "run_sandboxed",
]
