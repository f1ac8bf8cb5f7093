"""verl's own math_verify grader as a verl custom reward function (the in-process baseline of
bench/verl_step.py): verl 0.9.1 ships `verl.utils.reward_score.math_verify.compute_score(solution,
ground_truth)` but wires it to no data source, so a user points `custom_reward_function` at a
file like this one."""

from __future__ import annotations

from typing import Any


def compute_score(
    data_source: str, solution_str: str, ground_truth: str, extra_info: Any = None, **_: Any
) -> float:
    from verl.utils.reward_score import math_verify

    return float(math_verify.compute_score(solution_str, ground_truth))
