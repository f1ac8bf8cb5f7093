"""Drive verl 0.9.1's own reward code through `pkg://supervisor.adapters.verl` (run in envs/trl).

Usage: python verl_reward_loop.py RECIPE WORKDIR ROWS_JSON  -> one JSON report on the last stdout
                                                            line.
MATH_PYTHON names the math env's python for the example file, which `remote` loads by path and
pickles.

verl's config is composed from its own `ppo_trainer.yaml` with the overrides a user types. Then, for
each reward-loop manager (naive, dapo, gdpo, rate_limited, remote):
  - in-process: one `RewardLoopWorker` (its `compute_score_batch`, one task per item);
  - as Ray actors: `RewardLoopManager(config).compute_rm_score(batch)`, as `RayPPOTrainer` calls it
    (no reward model, so no GPU resource pool: verl passes None there too);
and the legacy `verl.workers.reward_manager` classes the 0.9.1 trainer no longer reaches (naive,
batch, prime), constructed directly. Every reward is read back from what verl built (`rm_scores`,
the legacy reward tensor).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
import ray
import torch
import verl
from hydra import compose, initialize_config_dir
from verl import DataProto

ENTRY = "pkg://supervisor.adapters.verl"


def tokenizer_dir(rows: list[list[str]], where: Path) -> str:
    """A byte-level BPE tokenizer (decodes any text exactly), saved as verl's hf_tokenizer loads
    it."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    special = ["<pad>", "<s>", "</s>"]
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    bpe.train_from_iterator(
        [t for row in rows for t in row],
        trainers.BpeTrainer(special_tokens=special, initial_alphabet=alphabet),
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=bpe, pad_token="<pad>", bos_token="<s>", eos_token="</s>"
    )
    fast.save_pretrained(where)
    return str(where)


def batch(rows: list[list[str]], tokenizer: Any) -> DataProto:
    """verl's batch layout: left-padded prompts, right-padded responses, one attention mask."""
    prompts = [tokenizer.encode(f"Solve item {i}.") for i in range(len(rows))]
    responses = [tokenizer.encode(text) + [tokenizer.eos_token_id] for text, _ in rows]
    width_p, width_r = max(map(len, prompts)), max(map(len, responses))
    pad = tokenizer.pad_token_id
    prompt_ids = torch.tensor([[pad] * (width_p - len(p)) + p for p in prompts])
    response_ids = torch.tensor([r + [pad] * (width_r - len(r)) for r in responses])
    mask = torch.tensor(
        [
            [0] * (width_p - len(p)) + [1] * len(p) + [1] * len(r) + [0] * (width_r - len(r))
            for p, r in zip(prompts, responses, strict=True)
        ]
    )
    return DataProto.from_dict(
        tensors={
            "prompts": prompt_ids,
            "responses": response_ids,
            "attention_mask": mask,
            "input_ids": torch.cat([prompt_ids, response_ids], 1),
        },
        non_tensors={
            "data_source": np.array(["math"] * len(rows), dtype=object),
            "reward_model": np.array([{"ground_truth": gold} for _, gold in rows], dtype=object),
            "extra_info": np.array([{"index": i} for i in range(len(rows))], dtype=object),
        },
    )


def config(
    manager: str, name: str, workers: int, recipe: str, tokenizer: str, path: str = ENTRY
) -> Any:
    """verl's own trainer config with the overrides of the README's verl recipe."""
    overrides = [
        f"reward.reward_manager.name={manager}",
        f"reward.num_workers={workers}",
        f"reward.custom_reward_function.path={path}",
        f"reward.custom_reward_function.name={name}",
        f"+reward.custom_reward_function.reward_kwargs.recipe={recipe}",
        f"actor_rollout_ref.model.path={tokenizer}",
    ]
    with initialize_config_dir(
        config_dir=os.path.join(os.path.dirname(verl.__file__), "trainer", "config"),
        version_base=None,
    ):
        return compose(config_name="ppo_trainer", overrides=overrides)


def in_process(cfg: Any, data: DataProto) -> dict[str, Any]:
    from verl.experimental.reward_loop import RewardLoopWorker

    worker = RewardLoopWorker(cfg)
    outputs = worker.loop.run_until_complete(worker.compute_score_batch(data))
    return {
        "rewards": [float(o["reward_score"]) for o in outputs],
        "keys": sorted(outputs[0]["reward_extra_info"]),
    }


def as_ray_actors(cfg: Any, data: DataProto) -> dict[str, Any]:
    from verl.experimental.reward_loop import RewardLoopManager

    manager = RewardLoopManager(config=cfg, rm_resource_pool=None)
    try:
        out = manager.compute_rm_score(data)
        workers = ray.get(
            [w.__ray_call__.remote(lambda self: os.getpid()) for w in manager.reward_loop_workers]
        )
    finally:
        for worker in manager.reward_loop_workers:  # the next manager names its workers the same
            ray.kill(worker)
    return {
        "rewards": out.batch["rm_scores"].sum(-1).tolist(),
        "keys": sorted(out.non_tensor_batch),
        "workers": workers,
    }


def legacy(manager: str, name: str, recipe: str, tokenizer: Any, data: DataProto) -> list[float]:
    from functools import partial

    from verl.trainer.ppo.reward import _call_with_kwargs  # how verl wraps reward_kwargs in 0.9.1
    from verl.utils.import_utils import load_extern_object
    from verl.workers.reward_manager import get_reward_manager_cls

    fn = partial(
        _call_with_kwargs,
        load_extern_object(module_path=ENTRY, object_name=name),
        {"recipe": recipe},
    )
    reward = get_reward_manager_cls(manager)(tokenizer=tokenizer, num_examine=0, compute_score=fn)(
        data
    )
    return reward.sum(-1).tolist()


def main() -> None:
    recipe, workdir, rows = sys.argv[1], Path(sys.argv[2]), json.loads(sys.argv[3])
    from transformers import AutoTokenizer

    tok_dir = tokenizer_dir(rows, workdir / "tokenizer")
    tokenizer = AutoTokenizer.from_pretrained(tok_dir)
    data = batch(rows, tokenizer)
    # remote: a loop worker + a compute worker
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    report: dict[str, Any] = {
        "decoded": [tokenizer.decode(r, skip_special_tokens=True) for r in data.batch["responses"]]
    }
    for manager, name in [
        ("naive", "compute_score"),
        ("naive", "compute_score_sync"),
        ("dapo", "compute_score"),
        ("gdpo", "compute_score"),
        ("rate_limited", "compute_score"),
    ]:
        report[f"in_process/{manager}/{name}"] = in_process(
            config(manager, name, 2, recipe, tok_dir), data
        )
    # remote in-process: its compute worker is a Ray actor of its own (a child's start each), so
    # once, with the example file loaded by path; ray/remote below takes the pkg:// entry point
    example = str(Path(__file__).resolve().parents[2] / "examples" / "verl_compute_score.py")
    report["in_process/remote/example_file"] = in_process(
        config("remote", "compute_score_sync", 1, recipe, tok_dir, example), data
    )
    # as Ray actors: the same worker code as in-process, placed in actors that own their children;
    # naive (two actors sharing the batch) and remote (its own compute worker) cover what placement
    # changes, so dapo, gdpo and rate_limited run in-process only (each actor is a child's start)
    for manager, name, workers in [
        ("naive", "compute_score", 2),
        ("remote", "compute_score_sync", 1),
    ]:
        report[f"ray/{manager}/{name}"] = as_ray_actors(
            config(manager, name, workers, recipe, tok_dir), data
        )
    for manager, name in [
        ("naive", "compute_score_sync"),
        ("batch", "compute_score_batch"),
        ("prime", "compute_score_sync"),
    ]:
        report[f"legacy/{manager}/{name}"] = {
            "rewards": legacy(manager, name, recipe, tokenizer, data)
        }
    ray.shutdown()
    print(json.dumps(report))


if __name__ == "__main__":
    main()
