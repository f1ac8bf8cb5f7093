"""One managed child shared by a module's tests that only read it (score, health): started once,
closed after the module's last test. Built as tests/conftest.py's `managed` factory builds its
backends, so a shared child is the same child a test would have started for itself.

A module-scoped fixture is set up before the function-scoped leak guard takes its snapshot, so the
guard sees the shared child (and what it started at boot) as already there."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.conftest import managed_config


@contextmanager
def shared_child(
    python: Path,
    scorer: str,
    input_kind: str = "text",
    params: dict[str, Any] | None = None,
    **spec: Any,
) -> Iterator[Any]:
    from supervisor import ManagedScorerProcessBackend

    config = managed_config(python, scorer, input_kind, params, **spec)
    backend = ManagedScorerProcessBackend(config, start=False)
    try:
        backend.start()
        yield backend
    finally:
        backend.close()
