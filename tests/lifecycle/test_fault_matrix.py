"""Every fault in the matrix: a typed error naming the cause, no reward attached, service after."""

from __future__ import annotations

import pytest

from bench.fault_matrix import FAULTS, Fault, run
from supervisor import ScorerError


@pytest.mark.slow
@pytest.mark.parametrize("fault", FAULTS, ids=[f.name for f in FAULTS])
def test_fault(fault: Fault, math_python):
    outcome = run(fault)  # raises AssertionError if the failing call returned rewards
    error = outcome.error
    assert type(error).__name__ == fault.expected, repr(error)
    assert isinstance(error, ScorerError)
    assert error.pid == outcome.pid_before, "the error must name the child"
    assert f"pid={outcome.pid_before}" in str(error) and "status=" in str(error)
    if fault.expected in ("ScorerProcessDied", "ScorerTimeout"):
        assert error.signal_name == "SIGKILL"
    if fault.healthy:
        assert outcome.to_served_s is not None
    assert outcome.to_error_s < 5.0
