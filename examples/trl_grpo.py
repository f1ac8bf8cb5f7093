"""GRPO with TRL, rewarded by `math_verify` in its own managed child (envs/math, antlr 4.13.2).

Fully offline: a tiny random-weight Llama built from a config and a word-level tokenizer
trained on the fly. Run it from the trainer env `make env-trl` builds:

    envs/trl/.venv/bin/python examples/trl_grpo.py            # the math env by name (make env-math)
    envs/trl/.venv/bin/python examples/trl_grpo.py --async    # or --math-python PATH: another env

A random model never solves a problem, so `--force-golds` appends `\\boxed{gold}` to a scattered
3 in 7 of the completions and a wrong boxed answer to 1 in 7 before they are scored (a
smoke-test knob, so that no reward can pass for its neighbour's; leave it off for a real model).
`--report FILE` writes what was scored and what the trainer logged, for
tests/trainers/test_trl_grpo.py.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing below may reach a model hub

from supervisor import ManagedScorerProcessBackend
from supervisor.adapters.trl import TRLRewardFunction

PROBLEMS = [(a, b) for a in range(2, 6) for b in range(3, 5)]  # 8 prompts: "what is a + b ?"


def build_model_and_tokenizer(seed: int) -> tuple[Any, Any]:
    """A 2-layer Llama with random weights and a word-level tokenizer trained on the prompts."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    corpus = [f"what is {a} + {b} ? the answer is {a + b} ." for a, b in PROBLEMS] + [
        str(n) for n in range(20)
    ]
    tokenizer = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.train_from_iterator(
        corpus, trainers.WordLevelTrainer(special_tokens=["<pad>", "<unk>", "<s>", "</s>"])
    )
    hf_tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        pad_token="<pad>",
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
    )
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(hf_tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        pad_token_id=hf_tokenizer.pad_token_id,
        bos_token_id=hf_tokenizer.bos_token_id,
        eos_token_id=hf_tokenizer.eos_token_id,
    )
    return LlamaForCausalLM(config), hf_tokenizer


def forcing_golds(
    reward: TRLRewardFunction, force: bool, use_async: bool, journal: list[dict[str, Any]]
) -> Callable[..., Any]:
    """TRL's reward function (sync or async) that, when `force`, appends `\\boxed{gold}` (or a wrong
    boxed answer) to scattered completions before scoring; each call's scored texts, golds and
    rewards go to `journal`."""
    inner: Callable[..., Any] = reward.as_async() if use_async else reward

    def forced(completions: Sequence[str], answer: Sequence[str]) -> list[str]:
        if not force:
            return list(completions)
        call, out = len(journal), []
        for i, (text, gold) in enumerate(zip(completions, answer, strict=True)):
            slot = (5 * i + 3 * call) % 7  # a different scatter in every call
            out.append(
                text
                + (
                    f" \\boxed{{{gold}}}"
                    if slot in (0, 2, 5)
                    else f" \\boxed{{{gold}1}}"
                    if slot == 3
                    else ""
                )
            )
        return out

    def record(scored: list[str], answer: Sequence[str], rewards: list[float]) -> list[float]:
        journal.append({"texts": scored, "golds": list(answer), "rewards": rewards})
        return rewards

    def sync_reward(
        prompts: list[str], completions: list[str], answer: list[str], **kwargs: Any
    ) -> list[float]:
        scored = forced(completions, answer)
        return record(
            scored, answer, inner(prompts=prompts, completions=scored, answer=answer, **kwargs)
        )

    async def async_reward(
        prompts: list[str], completions: list[str], answer: list[str], **kwargs: Any
    ) -> Any:
        scored = forced(completions, answer)
        return record(
            scored,
            answer,
            await inner(prompts=prompts, completions=scored, answer=answer, **kwargs),
        )

    chosen = async_reward if use_async else sync_reward
    chosen.__name__ = reward.__name__  # TRL logs rewards/<__name__>
    return chosen


def train(
    math_python: str | None, use_async: bool, steps: int, force_golds: bool, seed: int
) -> dict[str, Any]:
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    model, tokenizer = build_model_and_tokenizer(seed)
    dataset = Dataset.from_list(
        [{"prompt": f"what is {a} + {b} ?", "answer": str(a + b)} for a, b in PROBLEMS]
    )
    process: dict[str, Any] = {"request_timeout": 120}
    if math_python is not None:
        process["python_executable"] = math_python
    backend = ManagedScorerProcessBackend(  # without a python, math_verify's declared env: `math`
        {"process": process, "scorer": {"name": "math_verify", "params": {"jobs": 1}}}
    )
    # The reward function closes its backend at interpreter exit; `with` closes it sooner.
    # gold from the `answer` column, ids and groups made for TRL
    reward = TRLRewardFunction(backend)
    scored: list[dict[str, Any]] = []
    reward_func = forcing_golds(reward, force_golds, use_async, scored)

    logged: list[dict[str, Any]] = []

    # what TRL's completions table shows at each logging step
    class PerCompletionLog(TrainerCallback):
        def on_log(
            self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any
        ) -> None:
            table = trainer._logs  # private, but it is the per-completion record TRL logs
            logged.append(
                {
                    "step": state.global_step,
                    "mean": (logs or {}).get(f"rewards/{reward.__name__}/mean"),
                    "rewards": list(table["rewards"][reward.__name__]),
                }
            )

    with tempfile.TemporaryDirectory() as out, backend:
        config = GRPOConfig(
            output_dir=out,
            max_steps=steps,
            per_device_train_batch_size=8,
            num_generations=4,
            max_completion_length=12,
            learning_rate=1e-3,
            logging_steps=1,
            save_strategy="no",
            report_to="none",
            use_cpu=True,
            seed=seed,
            disable_tqdm=True,
        )
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=[reward_func],
            args=config,
            train_dataset=dataset,
            processing_class=tokenizer,
            callbacks=[PerCompletionLog()],
        )
        trainer.train()
        child_pids = [backend.pid] if backend.pid is not None else []
    return {
        "mode": "async" if use_async else "sync",
        "name": reward.__name__,
        "scored": scored,
        "logged": logged,
        "child_pids": child_pids,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--math-python", help="python of the math scorer env (default: the built `math` env)"
    )
    parser.add_argument(
        "--async", dest="use_async", action="store_true", help="TRL's async reward function form"
    )
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument(
        "--force-golds", action="store_true", help="scatter right and wrong boxed answers"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--report", type=Path)
    args = parser.parse_args(argv)
    report = train(args.math_python, args.use_async, args.steps, args.force_golds, args.seed)
    rewards = [r for call in report["scored"] for r in call["rewards"]]
    print(
        f"{report['mode']}: {len(report['scored'])} reward calls, {len(rewards)} rewards, "
        f"mean {sum(rewards) / len(rewards):.3f}"
    )
    if args.report:
        args.report.write_text(json.dumps(report))


if __name__ == "__main__":
    main()
