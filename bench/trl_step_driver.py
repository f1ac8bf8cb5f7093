"""Runs in envs/trlbench (TRL, antlr 4.13.2): TRL's GRPOTrainer for a few steps with three rewards,
interleaved, and what the reward costs of each step. Printed as one JSON line; bench/trl_step.py
makes the line of `make bench` from it.

The model is examples/trl_grpo.py's tiny offline Llama. Its completions are random, so each one
gets a worked answer appended, with that answer's gold, from the math throughput bench's mix
(integers, percents, fractions, polynomials, radicals, an answer with no box; 2 in 9 wrong), the
next 16 of it each step, the same for the three rewards, so they score the same texts. The three
rewards:
- constant: 1.0 for every completion (what a step costs with a reward that costs nothing);
- trl: TRL's own `trl.rewards.accuracy_reward`, in-process, in this env, where it grades right;
- managed: math_verify in its managed child (envs/math), through `TRLRewardFunction`.
The share of a step is the time inside the reward function over the step's wall time, summed
over every step but each run's first (the warm-up).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

# prompts, texts, golds -> rewards
Grader = Callable[[list[str], list[str], list[str]], list[float]]
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from bench.common import workload  # noqa: E402
from examples.trl_grpo import PROBLEMS, build_model_and_tokenizer  # noqa: E402
from supervisor import ManagedScorerProcessBackend  # noqa: E402
from supervisor.adapters.trl import TRLRewardFunction  # noqa: E402

MIX = workload(1000, 144)  # distinct worked answers and their golds, 16 a step


class Timed:
    """A TRL reward function that appends the answers, times the inner call, and keeps what it
    scored."""

    def __init__(self, name: str, inner: Grader) -> None:
        self.__name__ = name
        self.inner = inner
        self.seconds: list[float] = []
        self.scored: list[tuple[list[str], list[str], list[str], list[float]]] = []

    def __call__(self, prompts: list[str], completions: list[str], **_: Any) -> list[float]:
        first = len(self.seconds) * len(completions)
        worked = [MIX[(first + k) % len(MIX)] for k in range(len(completions))]
        texts = [f"{text} {tail}" for text, (tail, _) in zip(completions, worked, strict=True)]
        golds = [gold for _, gold in worked]
        started = time.perf_counter()
        rewards = self.inner(prompts, texts, golds)
        self.seconds.append(time.perf_counter() - started)
        self.scored.append((list(prompts), texts, golds, list(rewards)))
        return rewards


def trl_accuracy(prompts: list[str], texts: list[str], golds: list[str]) -> list[float]:
    """TRL's accuracy_reward on plain-text completions (it reads conversational ones: one message
    each)."""
    from trl.rewards import accuracy_reward

    rewards = accuracy_reward([[{"role": "assistant", "content": text}] for text in texts], golds)
    if any(reward is None for reward in rewards):
        raise ValueError(f"TRL's accuracy_reward could not parse a gold of {golds}")
    return [float(reward) for reward in rewards]


def run(steps: int, rounds: int, math_python: str, params: dict[str, Any]) -> dict[str, Any]:
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    backend = ManagedScorerProcessBackend(
        {
            "process": {"python_executable": math_python},
            "scorer": {"name": "math_verify", "params": params},
        }
    )
    managed = TRLRewardFunction(backend)
    rewards = {
        "constant": Timed("constant", lambda prompts, texts, golds: [1.0] * len(texts)),
        "trl": Timed("trl", trl_accuracy),
        "managed": Timed(
            "managed",
            lambda prompts, texts, golds: list(
                managed(prompts=prompts, completions=texts, answer=golds)
            ),
        ),
    }
    step_s: dict[str, list[float]] = {name: [] for name in rewards}
    reward_s: dict[str, list[float]] = {name: [] for name in rewards}
    dataset = Dataset.from_list([{"prompt": f"what is {a} + {b} ?"} for a, b in PROBLEMS])

    class StepClock(TrainerCallback):
        def __init__(self, name: str) -> None:
            self.name, self.began, self.calls_before = name, 0.0, 0

        def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.began, self.calls_before = time.perf_counter(), len(rewards[self.name].seconds)

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if state.global_step > 1:  # each run's first step warms up
                step_s[self.name].append(time.perf_counter() - self.began)
                reward_s[self.name].append(sum(rewards[self.name].seconds[self.calls_before :]))

    with backend, tempfile.TemporaryDirectory() as out:
        trainers = {}
        for name, reward in rewards.items():
            model, tokenizer = build_model_and_tokenizer(seed=0)
            config = GRPOConfig(
                output_dir=os.path.join(out, name),
                max_steps=steps,
                per_device_train_batch_size=16,
                num_generations=8,
                max_completion_length=12,
                learning_rate=1e-3,
                logging_steps=1,
                save_strategy="no",
                report_to="none",
                use_cpu=True,
                seed=0,
                disable_tqdm=True,
            )
            trainers[name] = GRPOTrainer(
                model=model,
                reward_funcs=[reward],
                args=config,
                train_dataset=dataset,
                processing_class=tokenizer,
                callbacks=[StepClock(name)],
            )
        for _ in range(rounds):
            for trainer in trainers.values():
                trainer.train()
        # the same work: each grader's rewards on the other's texts equal the other's rewards
        mismatches = 0
        for prompts, texts, golds, got in rewards["managed"].scored:
            mismatches += sum(
                a != b for a, b in zip(trl_accuracy(prompts, texts, golds), got, strict=True)
            )
        for prompts, texts, golds, got in rewards["trl"].scored:
            again = managed(prompts=prompts, completions=texts, answer=golds)
            mismatches += sum(a != b for a, b in zip(again, got, strict=True))
        graded = [r for *_, got in rewards["managed"].scored for r in got]
    return {
        "steps": {name: len(values) for name, values in step_s.items()},
        "step_s": {name: statistics.median(values) for name, values in step_s.items()},
        "share": {name: sum(reward_s[name]) / sum(step_s[name]) for name in rewards},
        "reward_ms": {name: 1e3 * statistics.median(reward_s[name]) for name in rewards},
        "items_per_step": 16,
        "mismatches": mismatches,
        "right": sum(graded) / len(graded),
    }


if __name__ == "__main__":
    steps, rounds, math_python, params = (
        int(sys.argv[1]),
        int(sys.argv[2]),
        sys.argv[3],
        json.loads(sys.argv[4]),
    )
    print(json.dumps(run(steps, rounds, math_python, params)))
