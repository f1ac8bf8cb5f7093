"""`managed-scorers demo` (`make demo`): why this project exists, in one run, from a checkout or an
install.

math-verify reads `\\boxed{10\\%}` through antlr. hydra-core 1.3.2 pins antlr4-python3-runtime
4.9.*, and under 4.9.3 math-verify 0.9.0 grades a correct `10\\%` for a gold of 0.1 as 0.0, with no
error. The demo grades the same samples in a managed child (the math env: antlr 4.13.2) and, where
this python has math-verify, in this process, as a trainer's own grader would; where it has not, it
says what that grader gives and where it is measured, and measures nothing it did not run.
A scorer env that is not built is built first, by the builder `managed-scorers envs build` runs
(`--no-build`: name the command instead). `--tour` adds the image, OCR and MiniLM envs (torch,
about 1.5 GB) and a GRPO panel.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import re
import sys
import textwrap
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from supervisor import scorer_envs
from supervisor.backends.local import LocalRewardBackend
from supervisor.backends.managed import ManagedScorerProcessBackend
from supervisor.compose.recipes import build_panels, load_recipe
from supervisor.ops import env_builder
from supervisor.ops.preflight import preflight
from supervisor.types import RewardItem, RewardRequest

SAMPLES = Path(__file__).with_name("demo_samples.json")
MATH_TIMEOUT_S = 3.0
ANTLR = "antlr4-python3-runtime"
HYDRA_ANTLR = "4.9.3"  # what pip resolves under hydra-core 1.3.2 (antlr4-python3-runtime==4.9.*)
TOUR_ENVS = ("math", "image", "ocr", "embed")
STARTED = time.monotonic()


def say(line: str = "") -> None:
    print(line, flush=True)


def tell(text: str) -> None:
    """A sentence or two, wrapped for a terminal."""
    say(textwrap.fill(text, 100, break_on_hyphens=False))


def ensure_envs(names: Sequence[str], build: bool) -> None:
    """Build the scorer envs `names` that are not built (or whose pins changed) with the builder
    `managed-scorers envs build` runs; with build False, raise naming that command instead."""
    missing = [name for name in names if not _ready(env_builder.status(name))]
    if not missing:
        return
    command = f"managed-scorers envs build {' '.join(missing)}"
    if not build:
        where = scorer_envs.env_dir(missing[0]).parent.parent
        raise scorer_envs.EnvError(
            f"scorer env(s) {', '.join(missing)} not built under {where}: run `{command}`"
        )
    for name in missing:
        venv = scorer_envs.env_dir(name)
        heavy = " (torch: about 1.5 GB on a cold pip cache)" if name == "embed" else ""
        say(
            f"building the {name} env{heavy}, as `managed-scorers envs build {name}` does, "
            f"into {venv}"
        )
        began = time.monotonic()
        # its phase lines and progress on stderr
        env_builder.build(scorer_envs.spec_path(name), venv)
        say(
            f"  built in {time.monotonic() - began:.1f} s (once: later runs reuse it until "
            f"its pins change)"
        )


def _ready(status: env_builder.EnvStatus) -> bool:
    return status.built and not status.pins_changed


def make_image(kind: str, size: int = 256) -> np.ndarray:
    rng = np.random.default_rng(0)
    if kind == "flat":
        return np.full((size, size, 3), 128, np.uint8)
    if kind == "gradient":
        ramp = np.linspace(0, 255, size, dtype=np.float64)
        return np.stack([np.add.outer(ramp, ramp) / 2] * 3, axis=-1).astype(np.uint8)
    if kind == "checker":
        tile = (np.indices((size, size)).sum(axis=0) // 16 % 2 * 255).astype(np.uint8)
        return np.repeat(tile[:, :, None], 3, axis=2)
    return rng.integers(0, 256, (size, size, 3), dtype=np.uint8)


def render_text(text: str) -> np.ndarray:
    """Black DejaVu Sans on white: what a text-rendering reward would see."""
    from PIL import Image, ImageDraw, ImageFont

    image = Image.new("RGB", (512, 128), "white")
    ImageDraw.Draw(image).text(
        (20, 30), text, fill="black", font=ImageFont.truetype("DejaVuSans.ttf", 48)
    )
    return np.asarray(image)


def run_managed(
    scorer: str, env: str, kind: str, params: dict, request: RewardRequest
) -> tuple[list[float], dict]:
    spec = {
        "env": env,  # a scorer env by name: built by `make envs` or `managed-scorers envs build`
        "scorer": {"name": scorer, "input_kind": kind, "params": params},
        "client": {"input_kind": kind},
    }
    backend = ManagedScorerProcessBackend(spec)
    try:
        packages = backend.health()["packages"]
        started = time.monotonic()
        response = backend.compute_rewards(request)
        score_s = time.monotonic() - started
        shared = backend.ready_info.get("shared_memory")
    finally:
        backend.close()
    timings = {
        "spawn_to_ready_s": backend.timings["spawn_to_ready_s"],
        "score_s": score_s,
        "shared_memory": shared,
        "shutdown_s": backend.timings["shutdown_s"],
        "packages": packages,
        "pid": backend.pid,
        "diagnostics": response.diagnostics,
    }
    return response.rewards, timings


def grpo_panel(samples: dict) -> None:
    """A GRPO step's rewards from a verl-omni-style recipe: groups of 4, a required math term in
    its child, an optional comparative judge in-process, applicability by dataset."""
    recipe = {
        "reward": {
            "group_size": 4,
            "models": {
                "math": {"backend": "managed", "scorer": "math_verify", "env": "math",
                         "params": {"timeout_s": MATH_TIMEOUT_S}},
                "judge": {"backend": "local", "scorer": "pairwise_judge",
                          "params": {"inner": "token_f1"}},
            },
            "reward_functions": {
                "correct": {"model": "math", "weight": 1.0},
                "rank": {"model": "judge", "weight": 0.25, "required": False,
                         "applicable_datasets": ["gsm8k"]},
            },
        }
    }  # fmt: skip
    preflight(recipe)  # names every problem before anything starts
    train, _ = build_panels(load_recipe(recipe))
    items = [RewardItem(**s, id=f"r{k}") for k, s in enumerate(samples["grpo"])]
    with train:
        response = train.compute_rewards(RewardRequest(items=items))
    say("\nGRPO panel: final = 1.0 * correct + 0.25 * rank (rank: gsm8k only, optional)")
    say(f"  {'id':<5} {'group':<6} {'completion':<26} {'correct':>7} {'rank':>6} {'final':>6}")
    for i, item in enumerate(items):
        rank = response.component_rewards["rank"][i]
        say(
            f"  {item.id:<5} {item.group_id:<6} {item.text!r:<26} "
            f"{response.component_rewards['correct'][i]:>7.1f} "
            f"{'-' if rank is None else f'{rank:.2f}':>6} {response.rewards[i]:>6.2f}"
        )
    say(f"  metrics: {response.metrics()}")


def in_process_grader() -> str | None:
    """Why this python cannot grade math in-process (a trainer's own grader); None when it can."""
    missing = [
        module for module in ("math_verify", "sympy") if importlib.util.find_spec(module) is None
    ]
    if missing:
        return f"this python ({sys.executable}) has no {' or '.join(missing)}"
    return None


def antlr_pins() -> list[str]:
    """The installed distributions that pin antlr to 4.9 (hydra-core 1.3, omegaconf 2.3), as `name
    version (pin)`."""
    found = []
    for dist in importlib.metadata.distributions():
        for requirement in dist.requires or []:
            spec, _, marker = (part.strip() for part in requirement.partition(";"))
            # hydra-core 1.3.2 writes `antlr4-python3-runtime (==4.9.*)`
            spec = re.sub(r"[\s()]", "", spec)
            if "extra" not in marker and re.fullmatch(
                rf"{ANTLR}==4\.9(\.\*|\.\d+)?", spec, re.IGNORECASE
            ):
                found.append(f"{dist.metadata['Name']} {dist.version} ({spec})")
    return sorted(set(found))


def math_story(samples: dict, hostile: bool = False) -> tuple[dict, bool]:
    """The math samples (and with `hostile`, an item no grader finishes) graded in the managed child
    and, where this python can, in-process; True when the child graded the percent answer right."""
    rows = samples["math"] + (samples["hostile"] if hostile else [])
    request = RewardRequest(items=[RewardItem(**s) for s in rows])
    params = {"timeout_s": MATH_TIMEOUT_S}
    managed, info = run_managed("math_verify", "math", "text", params, request)
    first_reward_s = time.monotonic() - STARTED
    child = info["packages"]
    say(
        f"managed child: {scorer_envs.env_dir('math')}: math-verify "
        f"{child.get('math-verify')}, {ANTLR} {child.get(ANTLR)}"
    )
    cannot = in_process_grader()
    local: list[float] | None = None
    antlr = None
    if cannot is None:
        antlr = importlib.metadata.version(ANTLR)
        pins = antlr_pins()
        pinned = f", pinned by {', '.join(pins)}" if pins else ""
        say(
            f"in-process:    {sys.executable}: math-verify "
            f"{importlib.metadata.version('math-verify')}, {ANTLR} {antlr}{pinned}"
        )
        with LocalRewardBackend("math_verify", params=params) as backend:
            local = backend.compute_rewards(request).rewards
    print_verdicts(request, managed, local)
    timeouts = info["diagnostics"]["math_verify"]["values"]["timeouts"]
    stopped = (
        f"; {timeouts} item(s) stopped at the {MATH_TIMEOUT_S:g} s timeout, scored 0"
        if timeouts
        else ""
    )
    tell(
        f"first managed reward {first_reward_s:.1f} s after the demo started (the child's "
        f"spawn to ready {info['spawn_to_ready_s']:.2f} s, the call {info['score_s']:.2f} "
        f"s{stopped})"
    )
    percent = [item.id for item in request.items].index("pct")
    tell_in_process(local[percent] if local is not None else None, cannot, antlr)
    return info, managed[percent] == 1.0


def print_verdicts(request: RewardRequest, managed: list[float], local: list[float] | None) -> None:
    """One row per sample: the child's reward beside this process's, flagged where they differ."""
    say()
    say(f"  {'id':<6} {'completion':<32} {'gold':<5} {'managed':>7} {'in-process':>10}")
    for i, item in enumerate(request.items):
        here = "-" if local is None else f"{local[i]:.1f}"
        flag = "  <- wrong in-process" if local is not None and local[i] != managed[i] else ""
        say(
            f"  {item.id:<6} {item.text:<32} {item.reference!s:<5} {managed[i]:>7.1f} "
            f"{here:>10}{flag}"
        )
    say()


def tell_in_process(percent_local: float | None, cannot: str | None, antlr: str | None) -> None:
    """What the in-process column means: measured under hydra's pin, under another antlr, or not at
    all."""
    if percent_local is None:
        tell(
            f"in-process: not measured: {cannot}. A trainer's own grader under hydra-core "
            f"1.3.2's pin ({ANTLR} {HYDRA_ANTLR}) with math-verify 0.9.0 grades `pct` 0.0: "
            f"`make demo` in the project's checkout "
            "measures it. To measure it here, in a scratch venv beside managed-scorers: "
            "`pip install hydra-core==1.3.2 math-verify==0.9.0`, then `managed-scorers demo` again."
        )
    elif antlr == HYDRA_ANTLR:
        tell(
            f"in-process under hydra's antlr pin, `pct` (a correct 10% for 0.1) got "
            f"{percent_local:.1f}, with no "
            "error: the trainer would learn from a wrong reward. The managed child grades it "
            "with its own antlr."
        )
    else:
        tell(
            f"this python's antlr is {antlr}, not hydra's {HYDRA_ANTLR}: its column is this "
            f"env's grader, not a "
            "hydra trainer's (`make demo` in the project's checkout shows one)."
        )


def run(tour: bool = False, build: bool = True) -> int:
    """The demo: math first; with `tour`, the other envs and a GRPO panel. 0 when the child graded
    `pct` right."""
    samples = json.loads(SAMPLES.read_text())
    say(
        "managed-scorers demo: one math grader in a managed child, and in this process where "
        "it can be"
    )
    ensure_envs(TOUR_ENVS if tour else ("math",), build)
    if tour and importlib.util.find_spec("PIL") is None:
        raise scorer_envs.EnvError(
            "--tour renders text with Pillow in this python: `pip install pillow`"
        )
    math_info, right = math_story(samples, hostile=tour)
    if not right:
        say(
            "the managed child graded `pct` wrong: its env is not the math spec's "
            "(`managed-scorers envs list`)"
        )
    if not tour:
        say()
        tell(
            "next: `managed-scorers demo --tour` (`make tour` in a checkout): image, OCR and "
            "MiniLM (torch) scorers in their own envs, and a GRPO panel"
        )
        return 0 if right else 1
    infos = {
        "math_verify (math)": math_info,
        "jpeg (image)": jpeg_images(samples),
        "ocr (ocr)": ocr_renders(samples),
        "text_similarity (embed)": text_similarities(samples),
    }
    grpo_panel(samples)
    say("\nlifecycle (seconds)")
    say(
        f"  {'child':<24} {'spawn->ready':>12} {'score':>8} {'shutdown':>9}  shared-memory "
        f"data plane"
    )
    for name, info in infos.items():
        say(
            f"  {name:<24} {info['spawn_to_ready_s']:>12.3f} {info['score_s']:>8.3f} "
            f"{info['shutdown_s']:>9.3f}  {'negotiated' if info['shared_memory'] else 'in-band'}"
        )
    return 0 if right else 1


def jpeg_images(samples: dict) -> dict:
    image_request = RewardRequest(
        items=[RewardItem(id=s["id"], image=make_image(s["kind"])) for s in samples["images"]]
    )
    jpeg, image_info = run_managed("jpeg_compressibility", "image", "image", {}, image_request)
    say("\njpeg_compressibility (minus JPEG q95 kB) in a managed child (envs/image)")
    for item, value in zip(image_request.items, jpeg, strict=True):
        say(f"  {item.id:<10} {value:>9.3f}")
    return image_info


def ocr_renders(samples: dict) -> dict:
    ocr_request = RewardRequest(
        items=[
            RewardItem(id=s["id"], image=render_text(s["render"]), reference=s["target"])
            for s in samples["ocr"]
        ]
    )
    ocr, ocr_info = run_managed("ocr", "ocr", "image", {"det_limit_side_len": 480}, ocr_request)
    say("\nocr (1 - normalized edit distance to the target) in a managed child (envs/ocr)")
    for item, value in zip(ocr_request.items, ocr, strict=True):
        say(f"  {item.id:<10} target {item.reference!r:<18} {value:>6.3f}")
    return ocr_info


def text_similarities(samples: dict) -> dict:
    text_request = RewardRequest(items=[RewardItem(**s) for s in samples["text"]])
    similarity, text_info = run_managed("text_similarity", "embed", "text", {}, text_request)
    say("\ntext_similarity (MiniLM cosine) in a managed child (envs/embed, torch)")
    for item, value in zip(text_request.items, similarity, strict=True):
        say(f"  {item.id:<11} {item.text!r:<44} vs {item.reference!r:<30} {value:>6.3f}")
    return text_info
