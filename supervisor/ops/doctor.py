"""`managed-scorers doctor RECIPE`: check a recipe end to end and say what is wrong, with the fix.

First, this install: its version, where it lives, and which extras it has (a command that needs a
missing one names it). supervisord sharing our `supervisor` package never gets this far: the CLI
refuses it before any command runs (scorers/install.py). Then, in order, stopping a backend's checks
at its first failure: the recipe parses and passes
preflight (envs, imports, pins, panels, without starting anything); then for each distinct
backend: its python runs, its child boots (the child's own exit code and log tail say why
not), one sample of its input kind scores to a finite reward, and a managed child took the
shared-memory data plane. Every check is one line; a failed one gets a `fix:` line.
"""

from __future__ import annotations

import importlib.metadata
import json
import math
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from child_runtime.protocol import exit_codes
from scorers import install
from supervisor.backend import RewardBackend
from supervisor.backends.managed import ManagedScorerProcessBackend
from supervisor.compose.recipes import load_recipe, make_backend
from supervisor.config import (
    BackendConfig,
    JobBackendConfig,
    ManagedScorerProcessSpec,
    PanelConfig,
    RemoteBackendConfig,
)
from supervisor.errors import ConfigError, ScorerStartupError
from supervisor.ops.preflight import preflight
from supervisor.types import RewardItem, RewardRequest

PYTHON_RUN_TIMEOUT_S = 60.0


@dataclass
class Check:
    what: str
    ok: bool
    detail: str = ""
    fix: str = ""

    def lines(self) -> list[str]:
        head = f"{'ok  ' if self.ok else 'FAIL'}  {self.what}" + (
            f": {self.detail}" if self.detail else ""
        )
        return [head] + ([f"      fix: {self.fix}"] if self.fix and not self.ok else [])


def sample_request(input_kind: str, group_size: int | None = None) -> RewardRequest:
    """One plausible item of each input kind (a gradient image, a short clip, a tone, a math
    answer); with a group size, a group of that many candidates for the one prompt."""
    ramp = np.linspace(0, 255, 64, dtype=np.float64)
    image = np.stack([np.add.outer(ramp, ramp) / 2] * 3, axis=-1).astype(np.uint8)
    if input_kind == "image":
        item = RewardItem(id="doctor", image=image, prompt="a gradient", reference="a gradient")
    elif input_kind == "image_edit":
        item = RewardItem(
            id="doctor", image=image, condition_images=[image[::-1].copy()], prompt="flip it"
        )
    elif input_kind == "video":
        item = RewardItem(id="doctor", video=np.stack([image] * 4), prompt="a still gradient")
    elif input_kind == "audio":  # a 440 Hz tone at half scale, 0.1 s of 16 kHz stereo
        tone = (0.5 * np.sin(2 * np.pi * 440 * np.arange(1600) / 16000)).astype(np.float32)
        item = RewardItem(
            id="doctor", audio=np.stack([tone, tone]), audio_sample_rate=16000, prompt="a tone"
        )
    else:
        item = RewardItem(
            id="doctor", prompt="What is 1 + 1?", text="1 + 1 = \\boxed{2}", reference="2"
        )
    if group_size is None:
        return RewardRequest(items=[item])
    texts = [item.text, "2", "1 + 1 = 3", "two"]
    group = [
        item.model_copy(
            update={
                "id": f"doctor-{k}",
                "group_id": "doctor",
                "text": texts[k % len(texts)] if item.text else None,
            }
        )
        for k in range(group_size)
    ]
    return RewardRequest(items=group, group_size=group_size)


def _backends(panels: list[PanelConfig | None]) -> dict[str, tuple[str, BackendConfig, int | None]]:
    """Distinct backend configs (as a recipe's panels share them), each with the first term naming
    it and its panel's group size."""
    found: dict[str, tuple[str, BackendConfig, int | None]] = {}
    for panel in panels:
        for term in panel.terms if panel is not None else ():
            key = json.dumps(term.backend.model_dump(mode="json"), sort_keys=True)
            found.setdefault(
                key, (term.name, term.backend, panel.group_size if panel is not None else None)
            )
    return found


def _python_runs(spec: ManagedScorerProcessSpec) -> Check:
    python = spec.process.python_executable
    what = f"python {python} runs"
    try:
        done = subprocess.run(
            [str(python), "-c", "import sys; print(sys.version.split()[0])"],
            capture_output=True,
            text=True,
            timeout=PYTHON_RUN_TIMEOUT_S,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return Check(what, False, str(exc), _rebuild(spec))
    if done.returncode != 0:
        return Check(
            what, False, (done.stderr.strip().splitlines() or ["no output"])[-1], _rebuild(spec)
        )
    return Check(what, True, f"Python {done.stdout.strip()}")


def _rebuild(spec: ManagedScorerProcessSpec) -> str:
    name = spec.env or "NAME"
    return f"rebuild the scorer env: managed-scorers envs build {name} --force"


def _boot_fix(exc: ScorerStartupError) -> str:
    code = exc.record.returncode if exc.record is not None else None
    if code == exit_codes.SCORER_IMPORT_FAILED:
        return (
            "the scorer env lacks a package the scorer imports: add it to the env's spec and "
            "rebuild it"
        )
    if code == exit_codes.BAD_CONFIG:
        return (
            "the scorer's name, params, input kind or a pin is wrong for this env: see the "
            "message above"
        )
    if code == exit_codes.SCORER_LOAD_FAILED:
        return "the scorer's load() failed (weights, device, memory): the log tail above says where"
    return "see the child's log tail above; raise process.startup_timeout if it only needs longer"


def _check_backend(
    term: str, config: BackendConfig, group_size: int | None, say: Callable[[Check], None]
) -> bool:
    where = (
        f"[{term}] {config.kind} {getattr(getattr(config, 'scorer', None), 'name', '')}".rstrip()
    )
    backend = _started_backend(where, config, say)
    if backend is None:
        return False
    with backend:
        managed = backend if isinstance(backend, ManagedScorerProcessBackend) else None
        ready = managed.ready_info if managed is not None else {}
        if managed is not None:
            boot_s = managed.timings.get("spawn_to_ready_s")
            say(
                Check(
                    f"{where}: child boots",
                    True,
                    f"pid {ready.get('pid')}, ready in {boot_s or 0:.2f} s",
                )
            )
        kind = (
            config.input_kind if isinstance(config, JobBackendConfig) else config.client.input_kind
        )
        ok = _sample_scores(where, backend, kind, group_size, say)
        if (
            managed is not None
            and isinstance(config, ManagedScorerProcessSpec)
            and config.client.shared_memory_min_bytes is not None
        ):
            shared = bool(ready.get("shared_memory"))
            say(
                Check(
                    f"{where}: shared-memory data plane",
                    shared,
                    "negotiated"
                    if shared
                    else f"refused ({ready.get('shared_memory_error')}); arrays travel in-band",
                    "memfd or /dev/shm is unavailable or full here: free it, or accept the "
                    "in-band cost",
                )
            )
            ok = ok and shared
    return ok


def _started_backend(
    where: str, config: BackendConfig, say: Callable[[Check], None]
) -> RewardBackend | None:
    """The backend, started; None once a failed check (its python, its boot, its start) is said."""
    if isinstance(config, ManagedScorerProcessSpec):
        check = _python_runs(config)
        say(Check(f"{where}: {check.what}", check.ok, check.detail, check.fix))
        if not check.ok:
            return None
    try:
        return make_backend(config)
    except ScorerStartupError as exc:
        say(Check(f"{where}: child boots", False, str(exc).splitlines()[0], _boot_fix(exc)))
        return None
    except Exception as exc:  # noqa: BLE001 - any failure to start is one failed check; the others still run
        fix = (
            "is the server running, and the token in the named variable?"
            if isinstance(config, (RemoteBackendConfig, JobBackendConfig))
            else "see the message"
        )
        say(
            Check(
                f"{where}: backend starts",
                False,
                f"{type(exc).__name__}: {exc}".splitlines()[0],
                fix,
            )
        )
        return None


def _sample_scores(
    where: str,
    backend: RewardBackend,
    kind: str,
    group_size: int | None,
    say: Callable[[Check], None],
) -> bool:
    """One sample of `kind` scores to a finite reward (said as one check, failed or not)."""
    what = f"{where}: one {kind} sample scores"
    try:
        response = backend.compute_rewards(sample_request(kind, group_size))
        reward = response.rewards[0]
        finite = response.successes[0] and math.isfinite(reward)
        say(
            Check(
                what,
                finite,
                f"reward {reward}"
                if finite
                else f"not a whole reward ({reward}): {response.errors[0]}",
                "the scorer fails on a plain sample: run it in-process (LocalRewardBackend) "
                "to debug",
            )
        )
        return finite
    except Exception as exc:  # noqa: BLE001 - reported as this check's failure, with its type
        detail = f"{type(exc).__name__}: {exc}".splitlines()[0]
        say(Check(what, False, detail, "see the message; the child's log tail is in the error"))
        return False


def install_check() -> Check:
    """This install: managed-scorers' version and folder, and which extras this python has
    (informational)."""
    try:
        version = importlib.metadata.version("managed-scorers")
    except importlib.metadata.PackageNotFoundError:
        version = "(not installed: a checkout)"
    where = Path(__file__).resolve().parents[2]
    extras = ", ".join(
        f"{extra} {'no' if install.missing_extra(extra, 'doctor') else 'yes'}"
        for extra in install.EXTRAS
    )
    return Check(f"managed-scorers {version} at {where}", True, f"extras: {extras}")


def doctor(recipe: str | Path, say: Callable[[Check], None]) -> bool:
    """Run every check, reporting each through `say`; True when all passed."""
    say(install_check())
    try:
        report = preflight(recipe, raise_on_problems=False)
    except ConfigError as exc:
        say(
            Check(
                f"recipe {recipe} reads",
                False,
                str(exc),
                "fix the recipe (see the README's recipes section)",
            )
        )
        return False
    for problem in report.problems:
        say(Check("preflight", False, problem, "fix the recipe or build the env it names"))
    if report.problems:
        return False
    parsed = load_recipe(recipe)
    # remote terms too: preflight checks only what runs from an env here
    terms = len(parsed.train.terms)
    say(
        Check(
            f"recipe {recipe} passes preflight",
            True,
            f"{terms} term(s), {len(report.scorers)} checked in their envs",
        )
    )
    for note in report.notes:
        say(Check("note", True, note))
    backends = _backends([parsed.train, parsed.validation]).values()
    results = [
        _check_backend(term, config, group_size, say) for term, config, group_size in backends
    ]
    return all(results)
