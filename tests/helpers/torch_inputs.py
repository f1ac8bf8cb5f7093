"""Torch CPU tensors wherever numpy arrays go; run by tests/trainers/test_torch_inputs.py in
envs/trl (it has torch).

argv[1]: the image env's python (for a managed child). Exits non-zero on the first failed check;
prints the names of the checks that passed, one JSON line.
"""

from __future__ import annotations

import json
import sys

import numpy as np
import torch

from supervisor import (
    LocalRewardBackend,
    ManagedScorerProcessBackend,
    RewardItem,
    ScorerRequestError,
)
from supervisor.adapters.ddpo import DDPORewardFn
from supervisor.adapters.images import _quantise_tensor, to_uint8_hwc

passed: list[str] = []


def check(name: str, ok: bool, detail: object = "") -> None:
    if not ok:
        raise AssertionError(f"{name}: {detail}")
    passed.append(name)


def refused(call, match: str) -> bool:
    try:
        call()
    except (ScorerRequestError, ValueError) as exc:
        return match in str(exc)
    return False


def main() -> None:
    generator = torch.Generator().manual_seed(0)
    nchw = torch.rand((3, 3, 16, 12), generator=generator)
    for output_range, tensor in (("zero_one", nchw), ("neg_one_to_one", nchw * 2 - 1)):
        for layout, laid in (("NCHW", tensor), ("NHWC", tensor.permute(0, 2, 3, 1))):
            got = to_uint8_hwc(laid, output_range, layout)
            want = to_uint8_hwc(laid.numpy(), output_range, layout)
            check(
                f"float {output_range} {layout} tensor == array",
                (got == want).all() and got.shape == (3, 16, 12, 3),
            )
    uint8 = (nchw.permute(0, 2, 3, 1) * 255).to(torch.uint8)
    check(
        "uint8 NHWC tensor passes unchanged",
        (to_uint8_hwc(uint8, "zero_one", "NHWC") == uint8.numpy()).all(),
    )
    check(
        "a tensor that requires grad is read",
        to_uint8_hwc(nchw.clone().requires_grad_(), "zero_one").shape[0] == 3,
    )
    bf16 = nchw.bfloat16()
    check(
        "bfloat16 images are quantised like their float32 values",
        (to_uint8_hwc(bf16, "zero_one") == to_uint8_hwc(bf16.float().numpy(), "zero_one")).all(),
    )
    # every .5 boundary
    ties = torch.arange(0, 511, dtype=torch.float32).reshape(1, 1, 1, 511) / 510
    for output_range, tensor in (("zero_one", ties), ("neg_one_to_one", ties * 2 - 1)):
        for layout, laid in (("NCHW", tensor), ("NHWC", tensor.permute(0, 2, 3, 1))):
            on_device = _quantise_tensor(
                laid, output_range, layout, 1e-3, lambda shape: np.empty(shape, np.uint8)
            )
            check(
                f"the on-device transform == the numpy one, {output_range} {layout}",
                (on_device == to_uint8_hwc(laid.numpy(), output_range, layout)).all(),
            )
    hot = nchw.bfloat16().clone()
    hot[2, 0, 0, 0] = 1.5
    check(
        "an out-of-range bfloat16 image is named",
        refused(lambda: to_uint8_hwc(hot, "zero_one"), "image 2 spans"),
    )
    hot[2, 0, 0, 0] = float("nan")
    check(
        "a non-finite bfloat16 image is named",
        refused(lambda: to_uint8_hwc(hot, "zero_one"), "image 2 has non-"),
    )
    check(
        "a bfloat16 item image is refused",
        refused(
            lambda: RewardItem(id="x", image=torch.zeros((4, 4, 3), dtype=torch.bfloat16)),
            "convert it first",
        ),
    )
    check(
        "a list is refused",
        refused(lambda: to_uint8_hwc([[0.0]], "zero_one"), "numpy array or a torch tensor"),
    )

    image = uint8[0].contiguous()
    item = RewardItem(id="a", text="x", image=image)
    check(
        "an item's tensor image is a view, not a copy", np.shares_memory(item.image, image.numpy())
    )
    video = torch.zeros((4, 8, 8, 3), dtype=torch.uint8)
    item = RewardItem(id="v", video=video, condition_images=[image])
    check("an item's tensor video is a view", np.shares_memory(item.video, video.numpy()))
    check(
        "condition images take tensors", np.shares_memory(item.condition_images[0], image.numpy())
    )
    check(
        "a float tensor image is refused like a float array",
        refused(lambda: RewardItem(id="b", image=nchw[0].permute(1, 2, 0)), "uint8"),
    )

    prompts, metadata = ["a", "b", "c"], [{}, {}, {}]
    with LocalRewardBackend("jpeg_compressibility") as local:
        from_array, _ = DDPORewardFn(local, output_range="zero_one")(
            nchw.numpy(), prompts, metadata
        )
        from_tensor, _ = DDPORewardFn(local, output_range="zero_one")(nchw, prompts, metadata)
    check("DDPO in-process: tensor == array", from_tensor.tolist() == from_array.tolist())
    spec = {
        "process": {"python_executable": sys.argv[1]},
        "scorer": {"name": "jpeg_compressibility", "input_kind": "image"},
        "client": {"input_kind": "image"},
    }
    with ManagedScorerProcessBackend(spec) as managed:
        rewards, info = DDPORewardFn(managed, output_range="zero_one")(nchw, prompts, metadata)
        segment = managed._gen.segment
        check(
            "DDPO managed child: tensor == in-process array",
            rewards.tolist() == from_array.tolist(),
            rewards,
        )
        sent = (segment.in_place_bytes, segment.copied_bytes)
        check(
            "DDPO managed child: built in the arena, sent in place",
            sent == (3 * 16 * 12 * 3, 0),
            sent,
        )
    print(json.dumps(passed))


if __name__ == "__main__":
    main()
