"""OpenRLHF 0.11.2's own SingleTurnAgentExecutor, run as its rollout does, against
--reward.remote_url values.

Run with the trainer env's python (envs/trl: openrlhf, aiohttp, torch, transformers):

    python openrlhf_executor.py PLAN_JSON REPORT_JSON

PLAN_JSON: {"jobs": [{"remote_url": ..., "rows": [[prompt, response, label], ...]}, ...]}. Each
remote_url is the flag's value as a user types it, split on commas as train_ppo_ray does (URLs, or
one .py file); the jobs run at once, one executor each. The generation engine is a fake, as
OpenRLHF's own tests use: it answers each prompt's token ids with that prompt's response, tokenized
by a real byte-level BPE tokenizer (trained here, offline, with chat special tokens), so the query
OpenRLHF decodes is what a vLLM rollout gives it. The report holds what each executor produced.
"""

from __future__ import annotations

import asyncio
import json
import sys
from types import SimpleNamespace
from typing import Any

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def tokenizer(corpus: list[str]) -> Any:
    """A Qwen-style tokenizer: byte-level BPE (decodes exactly what it encoded), chat tokens
    added."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(
        corpus,
        trainers.BpeTrainer(
            vocab_size=400,
            special_tokens=SPECIAL,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        ),
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        clean_up_tokenization_spaces=False,
    )


class FakeEngine:
    """What the executor calls on vLLM's engine: `await generate(prompt_token_ids, params,
    multi_modal_data=)`."""

    def __init__(self, hf_tokenizer: Any, responses: dict[str, str]) -> None:
        self.tokenizer, self.responses = hf_tokenizer, responses

    async def generate(
        self, prompt_token_ids: list[int], sampling_params: Any, multi_modal_data: Any = None
    ) -> Any:
        prompt = self.tokenizer.decode(prompt_token_ids, skip_special_tokens=False)
        text = self.responses[prompt] + "<|im_end|>"  # vLLM's output ends with the eos token
        ids = self.tokenizer(text=text, add_special_tokens=False)["input_ids"]
        output = SimpleNamespace(token_ids=ids, text=text, finish_reason="stop", logprobs=None)
        return SimpleNamespace(outputs=[output])


async def rollouts(
    remote_url: str, rows: list[list[Any]], hf_tokenizer: Any
) -> list[dict[str, Any]]:
    from openrlhf.utils.agent import SingleTurnAgentExecutor

    engine = FakeEngine(hf_tokenizer, {prompt: response for prompt, response, _ in rows})
    # train_ppo_ray: .split(",")
    executor = SingleTurnAgentExecutor(remote_rm_url=remote_url.split(","))
    # the fields of vLLM's SamplingParams it reads
    params = SimpleNamespace(max_tokens=256, logprobs=None)
    calls = [
        executor.execute(prompt, label, params, 1024, hf_tokenizer, engine)
        for prompt, _, label in rows
    ]
    outputs = await asyncio.gather(*calls)
    return [
        {key: out[key] for key in ("prompt", "label", "reward", "scores", "extra_logs")}
        for out in outputs
    ]


async def run_plan(jobs: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    hf_tokenizer = tokenizer(
        [prompt + response for job in jobs for prompt, response, _ in job["rows"]]
    )
    return await asyncio.gather(
        *(rollouts(job["remote_url"], job["rows"], hf_tokenizer) for job in jobs)
    )


def main() -> None:
    from importlib.metadata import version

    plan_path, report_path = sys.argv[1:3]
    with open(plan_path) as handle:
        jobs = json.load(handle)["jobs"]
    report = {"antlr": version("antlr4-python3-runtime"), "jobs": asyncio.run(run_plan(jobs))}
    with open(report_path, "w") as handle:
        json.dump(report, handle)


if __name__ == "__main__":
    main()
