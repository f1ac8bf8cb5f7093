"""verl-omni native reward models and score functions the native-model tests run in managed
children (by file path and by pkg://) and in-process (`expected`, as verl-omni calls them).
torch is imported inside: the test process imports this module for its images only.

Usage (in env embed): python tests/helpers/native_models.py OUT_DIR IMAGES.npz
writes OUT_DIR/quality.pt and OUT_DIR/aesthetic.pt and prints the in-process values as JSON.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np

BALLAST = 2_000_000  # float32 ones in a buffer: 8 MB a sleep must give back


def images(count: int) -> list[np.ndarray]:
    rng = np.random.default_rng(27)
    return [rng.integers(0, 256, (8, 6, 3), dtype=np.uint8) for _ in range(count)]


def _net(outputs: int, path: Any, device: Any) -> Any:
    import torch

    net = torch.nn.Sequential(torch.nn.Linear(3, 16), torch.nn.Tanh(), torch.nn.Linear(16, outputs))
    net.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))
    net.register_buffer("ballast", torch.ones(BALLAST))
    return net.eval().to(device)


def _features(images: list[Any]) -> Any:
    import torch

    return torch.stack([image.float().mean(dim=(1, 2)) / 255.0 for image in images])


class QualityModel:
    """Two logits per image; sync infer and close. `BUILT` counts the instances made in this
    process."""

    BUILT = 0

    def __init__(self, model_path: str, device: Any, scale: float = 1.0) -> None:
        self.device, self.scale = device, scale
        self.net = _net(2, model_path, device)
        QualityModel.BUILT += 1

    def infer(self, images: list[Any]) -> Any:
        import torch

        with torch.inference_mode():
            return (self.net(_features(images).to(self.device)) * self.scale).cpu()

    def close(self) -> None:
        del self.net


class AestheticModel:
    """One value per image; async infer and async close."""

    def __init__(self, model_path: str, device: Any) -> None:
        self.device = device
        self.net = _net(1, model_path, device)

    async def infer(self, image: Any) -> float:
        import torch

        with torch.inference_mode():
            return float(self.net(_features([image]).to(self.device))[0, 0])

    async def close(self) -> None:
        await asyncio.sleep(0)


class FragileModel(QualityModel):
    """Wakes once; every later `__init__` in the same process fails (a wake failure)."""

    def __init__(self, model_path: str, device: Any) -> None:
        if FragileModel.BUILT:
            raise RuntimeError("cannot wake twice")
        super().__init__(model_path, device)
        FragileModel.BUILT = 1


async def quality_score(data_source, solution_image, ground_truth, extra_info, reward_model):  # type: ignore[no-untyped-def]
    if extra_info.get("poison"):
        raise ValueError("poisoned item")
    assert str(solution_image.dtype) == "torch.uint8" and solution_image.shape[0] == 3  # CHW
    out = await reward_model.infer(images=[solution_image])
    return {"score": float(out[0, 0]), "builds": float(QualityModel.BUILT)}


def semantic_score(data_source, solution_image, ground_truth, extra_info, reward_model, scale=1.0):  # type: ignore[no-untyped-def]
    # a sync function: the handle returns the value
    out = reward_model.infer(images=[solution_image])
    return float(out[0, 1]) * scale + 0.01 * len(ground_truth or "")


async def flaky_score(
    data_source, solution_image, ground_truth, extra_info, reward_model, **kwargs
):  # type: ignore[no-untyped-def]
    if extra_info.get("flaky"):
        raise RuntimeError("flaky item")
    out = await reward_model.infer(images=[solution_image])
    return float(out[0, 0] - out[0, 1]) + kwargs["bias"] + (0.0 if data_source == "d" else 100.0)


def aesthetic_score(data_source, solution_image, ground_truth, extra_info, reward_model, trace_dir):  # type: ignore[no-untyped-def]
    value = reward_model.infer(solution_image)  # an async infer, from a sync function
    with open(os.path.join(trace_dir, "trace.txt"), "a") as handle:
        handle.write(f"{os.getpid()} {extra_info['uid']}\n")
    return value


class _Awaitable:
    """What verl-omni hands an async score function: `await reward_model.infer(...)`."""

    def __init__(self, model: Any) -> None:
        self.model = model

    async def infer(self, *args: Any, **kwargs: Any) -> Any:
        result = self.model.infer(*args, **kwargs)
        return await result if asyncio.iscoroutine(result) else result


class _Blocking(_Awaitable):
    def infer(self, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        result = self.model.infer(*args, **kwargs)
        return asyncio.run(result) if asyncio.iscoroutine(result) else result


def expected(
    out_dir: Path, arrays: list[np.ndarray], metadata: list[dict[str, Any]], references: list[str]
) -> dict:
    """Each term's value per item, calling the classes and functions directly (None where flaky
    fails)."""
    import torch

    cpu = torch.device("cpu")
    quality = QualityModel(model_path=str(out_dir / "quality.pt"), device=cpu, scale=1.5)
    aesthetic = AestheticModel(model_path=str(out_dir / "aesthetic.pt"), device=cpu)
    values: dict[str, list[Any]] = {"quality": [], "semantic": [], "flaky": [], "aesthetic": []}
    trace = out_dir / "in_process"
    trace.mkdir(exist_ok=True)
    for array, meta, gt in zip(arrays, metadata, references, strict=True):
        image = torch.from_numpy(np.ascontiguousarray(array.transpose(2, 0, 1)))
        args = {"data_source": "d", "solution_image": image, "ground_truth": gt, "extra_info": meta}
        values["quality"].append(
            asyncio.run(quality_score(**args, reward_model=_Awaitable(quality)))["score"]
        )
        values["semantic"].append(
            semantic_score(**args, reward_model=_Blocking(quality), scale=2.0)
        )
        flaky = (
            None
            if meta.get("flaky")
            else asyncio.run(flaky_score(**args, reward_model=_Awaitable(quality), bias=0.5))
        )
        values["flaky"].append(flaky)
        values["aesthetic"].append(
            aesthetic_score(**args, reward_model=_Blocking(aesthetic), trace_dir=str(trace))
        )
    return values


def save_weights(out_dir: Path) -> None:
    import torch

    for name, outputs, seed in (("quality", 2, 0), ("aesthetic", 1, 1)):
        torch.manual_seed(seed)
        net = torch.nn.Sequential(
            torch.nn.Linear(3, 16), torch.nn.Tanh(), torch.nn.Linear(16, outputs)
        )
        torch.save(net.state_dict(), out_dir / f"{name}.pt")


if __name__ == "__main__":
    out, given = Path(sys.argv[1]), np.load(sys.argv[2], allow_pickle=False)
    save_weights(out)
    count = len([key for key in given.files if key.startswith("image")])
    arrays = [given[f"image{i}"] for i in range(count)]
    spec = json.loads(str(given["spec"]))
    print(json.dumps(expected(out, arrays, spec["metadata"], spec["references"])))
