"""What a reward costs inside a real training step: TRL's GRPOTrainer, three rewards, one run.

`python -m bench.trl_step` (a line of `make bench`, which builds envs/trlbench): runs
bench/trl_step_driver.py in envs/trlbench (TRL with antlr 4.13.2, where TRL's own accuracy_reward
grades right) and reports each reward's share of a step: a constant reward, TRL's
`accuracy_reward` in-process, and the managed math grader (math_verify in its child, envs/math,
`jobs: 2`). Before the figures count, each grader's rewards on the other's texts must equal the
other's (the same work). Target (issue 29): the managed grader's share no larger than TRL's own.
"""

from __future__ import annotations

import json

STEPS = 6
ROUNDS = 3
MATH_PARAMS = {"jobs": 2}  # the managed grader as a user configures it


def main_line(steps: int = STEPS, rounds: int = ROUNDS, params: dict | None = None) -> str:
    from bench.common import env_python, run_driver

    chosen = json.dumps(params if params is not None else MATH_PARAMS)
    report = run_driver(
        "trlbench", "bench.trl_step_driver", str(steps), str(rounds), env_python("math"), chosen
    )
    if report["mismatches"]:
        raise RuntimeError(
            f"TRL's accuracy_reward and the managed grader disagree on "
            f"{report['mismatches']} rewards"
        )
    share, ms = report["share"], report["reward_ms"]
    return (
        f"TRL GRPO step ({report['items_per_step']} completions, "
        f"{report['steps']['managed']} steps each, {report['right']:.0%} right): reward "
        f"share of the step  constant {share['constant']:5.1%}  TRL accuracy_reward "
        f"in-process {share['trl']:5.1%} ({ms['trl']:.1f} ms)  managed math_verify "
        f"{share['managed']:5.1%} ({ms['managed']:.1f} ms)  managed/TRL "
        f"{share['managed'] / share['trl']:5.3f}"
    )


if __name__ == "__main__":
    print(main_line())
