"""What a reward costs inside verl 0.9.1's reward loop: the managed grader against verl's own.

`python -m bench.verl_step` (a line of `make bench`): runs bench/verl_step_driver.py in envs/trl
and reports the reward loop's time on one fixed 128-item batch (verl's `RewardLoopWorker`, naive
manager) through the shipped entry point (examples/verl_compute_score.py) and through verl's own
`math_verify.compute_score`, rounds interleaved, with the rewards checked equal on the batch. verl's
own grader runs in verl's env, where antlr is 4.9.3 (hydra and omegaconf pin it): the batch leaves
out the percent answers it grades wrong there, and the line says on how many of the whole mix it
disagrees with the managed grader (antlr 4.13.2 in its child).
"""

from __future__ import annotations

ITEMS = 128
ROUNDS = 5


def main_line(items: int = ITEMS, rounds: int = ROUNDS, pool_width: int = 0) -> str:
    """`pool_width` (the smoke run's): verl's own grader's spawn pool that wide, not verl's 4."""
    from bench.common import env_python, run_driver

    sizes = (str(items), str(rounds), env_python("math"), str(pool_width))
    report = run_driver("trl", "bench.verl_step_driver", *sizes)
    if report["mismatches"]:
        raise RuntimeError(
            f"verl's own grader and the managed one disagree on {report['mismatches']} rewards"
        )
    managed, own = report["seconds"]["managed"], report["seconds"]["verl"]
    return (
        f"verl reward loop, {report['items']} items ({report['right']:.0%} right): managed "
        f"entry point {managed * 1e3:7.1f} ms  verl's own math_verify {own * 1e3:7.1f} ms  "
        f"ratio {managed / own:5.3f}  (on the whole mix verl's own, antlr 4.9.3, disagrees on "
        f"{report['whole_mix_disagree']} of {report['whole_mix']}: the percent answers)"
    )


if __name__ == "__main__":
    print(main_line())
