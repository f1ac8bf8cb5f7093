"""verl-omni router-based reward functions and the tiny model the engine-model tests serve with
`transformers serve` (env engine), and the same model called in-process for the expected values.

`compute_score` keeps the seed's migration signature and calls `call_openai_compatible_server`,
the helper the seed leaves undefined, written here: one chat completion from the engine at
`reward_router_address` (host:port, no scheme), over the stdlib's client. The prompt carries the
ground truth and one word of the image (its mean brightness's last digit), so the reply depends on
both.

Usage (in env engine): python tests/helpers/engine_models.py MODEL_DIR CASES.json
builds the model into MODEL_DIR and prints each case's reply from it, as JSON.
"""

from __future__ import annotations

import asyncio
import json
import sys
import urllib.request
import zlib
from typing import Any

WORDS = "user assistant system : yes no score the image is a good bad rate".split()
MAX_TOKENS = 4
TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }} : {{ m['content'] }} {% endfor %}"
    "{% if add_generation_prompt %}assistant : {% endif %}"
)


def prompt_of(brightness: float, ground_truth: str) -> str:
    return f"rate the image {int(brightness) % 10} {ground_truth}"


def parse_score(reply: str) -> float:
    """A deterministic number of the reply text: equal replies, equal scores."""
    return (zlib.crc32(reply.encode()) % 1000) / 1000.0


def _chat(model: str, prompt: str) -> dict[str, Any]:
    messages = [{"role": "user", "content": prompt}]
    return {"model": model, "messages": messages, "max_tokens": MAX_TOKENS}


def _reply(body: dict[str, Any]) -> str:
    return str(body["choices"][0]["message"]["content"])


def _post_chat(address: str, model: str, prompt: str) -> str:
    """One chat completion through the stdlib (the functions' env needs no HTTP client)."""
    request = urllib.request.Request(
        f"http://{address}/v1/chat/completions",
        data=json.dumps(_chat(model, prompt)).encode(),
        headers={"content-type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=60) as answer:
        return _reply(json.loads(answer.read()))


async def call_openai_compatible_server(address: str, model: str, image: Any, prompt: str) -> str:
    text = prompt_of(float(image.float().mean()), prompt)
    return await asyncio.to_thread(_post_chat, address, model, text)


async def compute_score(
    data_source, solution_image, ground_truth, extra_info, reward_router_address, model_name
):
    response = await call_openai_compatible_server(
        address=reward_router_address,
        model=model_name,
        image=solution_image,
        prompt=ground_truth,
    )
    return {"score": parse_score(response)}


def length_score(
    data_source, solution_image, ground_truth, extra_info, reward_router_address, model_name
):
    """Sync (run on a worker thread): the reply's word count; `fail_words` fails."""
    if extra_info.get("fail_words"):
        raise ValueError("poisoned item")
    text = prompt_of(float(solution_image.float().mean()), ground_truth)
    return float(len(_post_chat(reward_router_address, model_name, text).split()))


def build(out: str) -> None:
    """A 1-layer Llama with a word-level tokenizer and a chat template, random weights, offline."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    words = ["<pad>", "<s>", "</s>", "<unk>", *map(str, range(10)), *WORDS]
    tokenizer = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )
    fast.pad_token, fast.chat_template = "<pad>", TEMPLATE
    fast.save_pretrained(out)
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(words),
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=128,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        initializer_range=1.0,  # large random weights: the reply depends on the prompt
    )
    LlamaForCausalLM(config).save_pretrained(out)


def expect(model_dir: str, cases_path: str) -> None:
    """Each case's reply from the model called directly (greedy, as the engine serves it)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    replies = []
    for case in json.loads(open(cases_path).read()):
        messages = [{"role": "user", "content": prompt_of(case["brightness"], case["prompt"])}]
        ids = tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
        )
        with torch.inference_mode():
            out = model.generate(**ids, max_new_tokens=MAX_TOKENS, do_sample=False)
        new = out[0, ids["input_ids"].shape[1] :]
        replies.append(tokenizer.decode(new, skip_special_tokens=True))
    print(json.dumps(replies))


if __name__ == "__main__":
    build(sys.argv[1])
    expect(sys.argv[1], sys.argv[2])
