"""Torch CPU tensors wherever numpy arrays go; run by tests/test_torch_inputs.py in envs/trl (it has torch).

argv[1]: the image env's python (for a managed child). Exits non-zero on the first failed check;
prints the names of the checks that passed, one JSON line.
"""

from __future__ import annotations

import json
import sys

import numpy as np
import torch

from supervisor import LocalRewardBackend, ManagedScorerProcessBackend, RewardItem, ScorerRequestError
from supervisor.adapters.ddpo import DDPORewardFn
from supervisor.adapters.images import to_uint8_hwc

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
            check(f"float {output_range} {layout} tensor == array", (got == want).all() and got.shape == (3, 16, 12, 3))
    uint8 = (nchw.permute(0, 2, 3, 1) * 255).to(torch.uint8)
    check("uint8 NHWC tensor passes unchanged", (to_uint8_hwc(uint8, "zero_one", "NHWC") == uint8.numpy()).all())
    check("a tensor that requires grad is read", to_uint8_hwc(nchw.clone().requires_grad_(), "zero_one").shape[0] == 3)
    check("bfloat16 is refused", refused(lambda: to_uint8_hwc(nchw.bfloat16(), "zero_one"), "convert it first"))
    check("a list is refused", refused(lambda: to_uint8_hwc([[0.0]], "zero_one"), "numpy array or a torch tensor"))

    image = uint8[0].contiguous()
    item = RewardItem(id="a", text="x", image=image)
    check("an item's tensor image is a view, not a copy", np.shares_memory(item.image, image.numpy()))
    video = torch.zeros((4, 8, 8, 3), dtype=torch.uint8)
    item = RewardItem(id="v", video=video, condition_images=[image])
    check("an item's tensor video is a view", np.shares_memory(item.video, video.numpy()))
    check("condition images take tensors", np.shares_memory(item.condition_images[0], image.numpy()))
    check(
        "a float tensor image is refused like a float array",
        refused(lambda: RewardItem(id="b", image=nchw[0].permute(1, 2, 0)), "uint8"),
    )

    prompts, metadata = ["a", "b", "c"], [{}, {}, {}]
    with LocalRewardBackend("jpeg_compressibility") as local:
        from_array, _ = DDPORewardFn(local, output_range="zero_one")(nchw.numpy(), prompts, metadata)
        from_tensor, _ = DDPORewardFn(local, output_range="zero_one")(nchw, prompts, metadata)
    check("DDPO in-process: tensor == array", from_tensor.tolist() == from_array.tolist())
    spec = {
        "process": {"python_executable": sys.argv[1]},
        "scorer": {"name": "jpeg_compressibility", "input_kind": "image"},
        "client": {"input_kind": "image"},
    }
    with ManagedScorerProcessBackend(spec) as managed:
        rewards, info = DDPORewardFn(managed, output_range="zero_one")(nchw, prompts, metadata)
    check("DDPO managed child: tensor == in-process array", rewards.tolist() == from_array.tolist(), rewards)
    print(json.dumps(passed))


if __name__ == "__main__":
    main()
