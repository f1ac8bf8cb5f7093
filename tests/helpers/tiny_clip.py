"""Build a tiny random-weight CLIP model directory, for testing clip_preference offline.

Usage: envs/embed/.venv/bin/python tests/helpers/tiny_clip.py OUT_DIR [SEED]

Writes config.json + model.safetensors (CLIPModel.save_pretrained), a CLIP tokenizer
(byte-level BPE over a 520-token vocab: the 256 byte symbols, each also as word end, a few
merges, and the two special tokens last, as in OpenAI's vocab), and preprocessor_config.json
(32x32, OpenAI CLIP mean/std). Same seed, same bytes.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from tokenizers.pre_tokenizers import ByteLevel
from transformers import CLIPConfig, CLIPModel, CLIPTokenizer

MERGES = [("c", "a"), ("ca", "t</w>"), ("d", "o"), ("do", "g</w>"), ("r", "e"), ("re", "d</w>")]
PREPROCESSOR = {
    "image_processor_type": "CLIPImageProcessor",
    "do_resize": True,
    "size": {"shortest_edge": 32},
    "resample": 3,
    "do_center_crop": True,
    "crop_size": {"height": 32, "width": 32},
    "do_rescale": True,
    "rescale_factor": 1 / 255,
    "do_normalize": True,
    "image_mean": [0.48145466, 0.4578275, 0.40821073],
    "image_std": [0.26862954, 0.26130258, 0.27577711],
    "do_convert_rgb": True,
}


def build_tokenizer() -> CLIPTokenizer:
    alphabet = sorted(ByteLevel.alphabet())
    vocab = {symbol: index for index, symbol in enumerate(alphabet)}
    vocab.update({symbol + "</w>": len(alphabet) + index for index, symbol in enumerate(alphabet)})
    for left, right in MERGES:
        vocab[left + right] = len(vocab)
    vocab["<|startoftext|>"] = len(vocab)
    vocab["<|endoftext|>"] = len(vocab)
    return CLIPTokenizer(vocab=vocab, merges=MERGES, model_max_length=77)


def build(out_dir: Path, seed: int = 0) -> None:
    tokenizer = build_tokenizer()
    config = CLIPConfig(
        text_config={
            "vocab_size": len(tokenizer),
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "max_position_embeddings": 77,
            "bos_token_id": tokenizer.bos_token_id,
            "eos_token_id": tokenizer.eos_token_id,  # pooling reads the first eos
            "pad_token_id": tokenizer.pad_token_id,
        },
        vision_config={
            "image_size": 32,
            "patch_size": 8,
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
        },
        projection_dim=16,
    )
    torch.manual_seed(seed)
    model = CLIPModel(config).eval()
    with torch.no_grad():  # a non-default scale, so a missing or doubled exp() shows in the scores
        model.logit_scale.fill_(3.0)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    (out_dir / "preprocessor_config.json").write_text(
        json.dumps(PREPROCESSOR, indent=2, sort_keys=True) + "\n"
    )


if __name__ == "__main__":
    target = Path(sys.argv[1])
    build(target, int(sys.argv[2]) if len(sys.argv) > 2 else 0)
    print(target)
