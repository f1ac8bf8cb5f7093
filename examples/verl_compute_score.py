"""verl's custom reward function, graded by math_verify in its own managed child (envs/math).

Point verl at this file (verl loads it by path in each reward worker):

    reward:
      custom_reward_function:
        path: examples/verl_compute_score.py
        name: compute_score        # the async reward loop: per-item tasks, coalesced into one
                                   request
        # name: compute_score_sync   for the legacy naive reward manager (one call per item)
        # name: compute_score_batch  for the batch reward manager (lists)

Each worker process builds its own child on its first call (a backend belongs to the process
that made it: a forked worker builds a new one, never shares its parent's), off the event
loop, and closes it at exit. A child that fails to start fails every call of that process at
once with the same error (no task waits out another boot). The child runs in the built `math`
scorer env (`managed-scorers envs build math`; MANAGED_SCORERS_ENVS says where envs live), or in
the python MATH_PYTHON names. The file holds no lock or client of its own (the per-process cache
is `supervisor.adapters.verl.process_scorer`), so verl's `remote` manager can pickle what it loads.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from supervisor import ManagedScorerProcessBackend
from supervisor.adapters.verl import VerlComputeScore, aprocess_scorer, process_scorer

KEY = ("examples/verl_compute_score.py",)


def _math_child() -> ManagedScorerProcessBackend:
    python = os.environ.get("MATH_PYTHON")
    where: dict[str, Any] = (
        {"process": {"python_executable": python}} if python else {"env": "math"}
    )
    return ManagedScorerProcessBackend(
        {**where, "scorer": {"name": "math_verify", "params": {"jobs": 2, "timeout_s": 10}}}
    )


def scorer() -> VerlComputeScore:
    """This process's `VerlComputeScore` over its own managed math child (made on first use)."""
    return process_scorer(KEY, _math_child)


async def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: str,
    extra_info: Mapping[str, Any] | None = None,
    **kwargs: Any,
) -> dict[str, Any]:
    # one boot, off the loop; the step's tasks wait on it
    ready = await aprocess_scorer(KEY, _math_child)
    return await ready.acompute_score(data_source, solution_str, ground_truth, extra_info)


def compute_score_sync(
    data_source: str,
    solution_str: str,
    ground_truth: str,
    extra_info: Mapping[str, Any] | None = None,
    **kwargs: Any,
) -> dict[str, Any]:
    return scorer()(data_source, solution_str, ground_truth, extra_info)


def compute_score_batch(
    data_sources: Sequence[str],
    solution_strs: Sequence[str],
    ground_truths: Sequence[str],
    extra_infos: Sequence[Mapping[str, Any] | None] | None = None,
    **kwargs: Any,
) -> list[dict[str, Any]]:
    return scorer().compute_score_batch(data_sources, solution_strs, ground_truths, extra_infos)
