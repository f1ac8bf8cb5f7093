"""torch_probe: a synthetic model scorer of a chosen size, for residency checks.

Why: the GPU check needs a model whose weight bytes are known in advance (1 GiB, 8 GiB),
that loads with no download and no model package, in any env or bare interpreter with torch.
Its weights are pseudo-random (a seeded tile, scaled per block: filling 8 GiB costs memory
bandwidth, not a random generator's time); its score is a cheap matvec that reads every
weight, so a call on an offloaded probe shows in the figures. It supports offload.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from scorers.base import ScoreItem, Scorer, ScoreResult, ScorerSpec
from scorers.residency import move_module, resolve_device

WIDTH = 1024  # floats per weight row: 4 KiB; a text's first WIDTH bytes are its input vector
TILE_ROWS = 256  # rows drawn from the seeded generator; the rest are scaled copies


class TorchProbe(Scorer):
    """`param_mib` MiB of float32 weights W (rows x WIDTH); score = mean(tanh(W @ x)) for x the
    text's bytes (first WIDTH, scaled to [0, 1], zero-padded)."""

    spec = ScorerSpec(
        name="torch_probe",
        input_kind="text",
        required_fields=("text",),
        terms=("torch_probe",),
        revision="1",
        env="embed",
        supports_offload=True,
        report_packages=("torch",),
        requires_modules=("torch",),
    )

    def __init__(self, param_mib: int = 1024, seed: int = 0) -> None:
        for name, value, least in (("param_mib", param_mib, 1), ("seed", seed, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"torch_probe: {name} must be an int >= {least}, got {value!r}")
        self.param_mib = param_mib
        self.seed = seed
        self.device = "cpu"
        self._module: Any = None

    def load(self, device: str = "cpu") -> None:
        import torch

        self.device = resolve_device(device)
        rows = max(1, self.param_mib * 2**20 // (4 * WIDTH))
        generator = torch.Generator().manual_seed(self.seed)
        tile = torch.randn(min(rows, TILE_ROWS), WIDTH, generator=generator) / WIDTH**0.5
        weight = torch.empty(rows, WIDTH)
        for block, start in enumerate(range(0, rows, TILE_ROWS)):
            stop = min(rows, start + TILE_ROWS)
            torch.mul(tile[: stop - start], 1.0 + (block % 7) / 7.0, out=weight[start:stop])
        module = torch.nn.Module()
        module.weight = torch.nn.Parameter(weight, requires_grad=False)
        self._module = module.eval()

    @property
    def param_bytes(self) -> int:
        return (
            int(self._module.weight.numel() * self._module.weight.element_size())
            if self._module is not None
            else 0
        )

    def onload(self) -> dict[str, Any]:
        return {
            **move_module(self._module, self.device, self.device),
            "param_bytes": self.param_bytes,
        }

    def offload(self) -> dict[str, Any]:
        return {**move_module(self._module, "cpu", self.device), "param_bytes": self.param_bytes}

    def score(self, items: Sequence[ScoreItem]) -> ScoreResult:
        import torch

        if self._module is None:
            raise RuntimeError("torch_probe: score() before load()")
        weight = self._module.weight
        inputs = torch.zeros(WIDTH, len(items))
        for column, item in enumerate(items):
            data = item.required_text().encode()[:WIDTH]
            if data:
                inputs[: len(data), column] = (
                    torch.frombuffer(bytearray(data), dtype=torch.uint8).float() / 255.0
                )
        with torch.inference_mode():
            scores = torch.tanh(weight @ inputs.to(weight.device)).mean(dim=0)
        return ScoreResult(terms={"torch_probe": scores.double().cpu().tolist()})

    def close(self) -> None:
        self._module = None
