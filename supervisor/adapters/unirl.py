"""UniRL 0.2.0: `ManagedScorerProcessBackend`, `ManagedLocalScorer` and `RewardPanel`, UniRL reward
backends of this project.

A UniRL recipe changes only its top `_target_`
(`unirl.reward.managed_process.ManagedScorerProcessBackend` ->
`supervisor.adapters.unirl.ManagedScorerProcessBackend`): `config=` (UniRL's own spec, or a mapping
of its fields) and `base_device=` are read by adapters/unirl_config into this project's managed
backend. `RewardPanel` takes one of our panel recipes (UniRL's remote multi-reward role, run here);
`RemoteRewardBackend` is UniRL's remote backend's drop-in for a server of ours (a served panel).

This module imports without UniRL. The two classes are made on first access (PEP 562 `__getattr__`):
when UniRL is importable they subclass `unirl.reward.base.RewardBackend`, so UniRL's RewardService
and RewardStack take them as their own; without UniRL they are plain classes with the same methods.
"""

from __future__ import annotations

import atexit
import logging
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from scorers.unirl.loading import bare_local_package
from supervisor.adapters.unirl_config import UniRLOptions, managed_spec, panel_config, remote_config
from supervisor.adapters.unirl_io import contributions, reward_request, unirl_response
from supervisor.adapters.unirl_local import local_spec
from supervisor.adapters.unirl_weighing import Weighing, check_served, weigh
from supervisor.backend import RewardBackend
from supervisor.backends.managed import ManagedScorerProcessBackend as _OurManagedBackend
from supervisor.compose.panel import RewardPanel as _OurPanel
from supervisor.compose.recipes import build_panel, make_backend
from supervisor.composition import component, leaf_shapes
from supervisor.errors import ScorerError
from supervisor.shape import ScorerShape
from supervisor.types import RewardRequest, RewardResponse

log = logging.getLogger(__name__)
_BUILT: dict[str, type] = {}
_BUILDING = threading.Lock()


def unirl_base() -> type | None:
    """UniRL's RewardBackend, or None when UniRL is not installed (a broken install raises)."""
    try:
        from unirl.reward.base import RewardBackend as UniRLRewardBackend
    except ModuleNotFoundError as exc:
        if exc.name is not None and exc.name.split(".")[0] == "unirl":
            return None
        raise
    return UniRLRewardBackend


def overridden(options: UniRLOptions, reference_key: str, given: dict[str, Any]) -> UniRLOptions:
    """The recipe's options with the base arguments that were given (not None) in their place."""
    return replace(
        options, reference_key=reference_key, **{k: v for k, v in given.items() if v is not None}
    )


class _UniRLFace:
    """What UniRL's RewardBackend base offers (and RewardService calls), over one backend of
    ours."""

    backend: RewardBackend
    input_kind = "image"
    _weighing_fields: Mapping[str, Any]
    _weighed: Weighing | None
    _required: list[str]

    def _set_base(self, options: UniRLOptions, backend: RewardBackend) -> None:
        """UniRL's base attributes (its __init__ sets only these), then the backend, closed at
        exit."""
        self.model_name, self.batch_size, self.timeout = (
            options.model_name,
            options.batch_size,
            options.timeout,
        )
        self.prompt_source, self.input_kind, self.reference_key = (
            options.prompt_source,
            options.input_kind,
            options.reference_key,
        )
        self.backend = backend
        self._weighing_fields, self._weighed = options.weighing, None
        self._required = []
        atexit.register(backend.close)  # idempotent; dispose() unregisters it

    def get_model_name(self) -> str:
        return self.model_name

    @property
    def preferred_input_kind(self) -> str:
        """The generated media it scores: image (image_edit too), video or text. An audio reward
        says video: UniRL's RewardService takes only those three, and its audio comes beside a video
        (a text-to-audio-video model's frontier); the backend reads the audio, not the frames."""
        return "video" if self.input_kind == "audio" else self.input_kind

    def prompts(self, request: Any) -> list[str]:
        """The original or the generation prompt of each row, by `prompt_source` (UniRL's rule)."""
        prompt = (
            request.original_prompt
            if self.prompt_source == "original"
            else request.generation_prompt
        )
        return [] if prompt is None else list(prompt.texts)

    def compute_rewards(self, request: Any) -> Any:
        """UniRL's RewardRequest -> UniRL's RewardResponse; a failure raises its typed error (UniRL
        fails the step on it either way), never zeros marked failed."""
        started = time.perf_counter()
        with self.backend.arena() as arena:
            ours = reward_request(
                request, self.input_kind, self.prompts(request), self.reference_key, arena.empty
            )
            response = self.backend.compute_rewards(ours)
        return self._answer(ours, response, started)

    def _answer(self, request: RewardRequest, response: RewardResponse, started: float) -> Any:
        """UniRL's RewardResponse: UniRL's own client's reward (`weighing`, over the scorer's
        terms), where this drop-in stands for one of UniRL's classes."""
        shape = component(self.backend).shape
        if shape is None:
            raise RuntimeError(f"{self.model_name}: the scorer's shape is not known yet")
        weighed = weigh(self._weighing(shape), response, shape)
        return unirl_response(
            weighed.rewards, weighed.components, weighed.successes, weighed.errors, started
        )

    def _weighing(self, shape: ScorerShape) -> Weighing:
        """UniRL's weighing of the rewards wanted (none named: the scorer's own), checked once."""
        if self._weighed is None:
            required = self._required or [shape.name]
            self._weighed = Weighing.of(self._weighing_fields, required)
            check_served(self._weighed, shape)
        return self._weighed

    def is_available(self) -> bool:
        """Whether every child behind it answers /health (UniRL polls this; it never raises)."""
        try:
            for leaf in component(self.backend).leaves():
                health = getattr(leaf, "health", None)
                if health is not None:
                    health()
        except ScorerError as exc:
            log.warning("%s is not available: %s", self.model_name, str(exc).splitlines()[0])
            return False
        return True

    def covers_prompt_video(self) -> bool:
        """For a video reward, whether a scorer behind it reads the prompt (UniRL's RewardService
        refuses a training reward that does not: an audio reward is one, it scores a video's
        frontier); a reward of another media kind has nothing to cover."""
        if self.preferred_input_kind != "video":
            return True
        return any("prompt" in shape.required_fields for shape in leaf_shapes(self.backend))

    def onload(self) -> None:
        self.backend.onload()

    def offload(self) -> None:
        self.backend.offload()

    def dispose(self) -> None:
        """Close the children (bounded); UniRL's RewardService.shutdown calls this."""
        atexit.unregister(self.backend.close)
        self.backend.close()


class _ManagedBackend(_UniRLFace):
    """One scorer child (this project's managed backend) from UniRL's managed-process recipe.

    `config`: UniRL's ManagedScorerProcessSpec, or a mapping of its fields (`history_kind: text` or
    `video` too, which UniRL's own dataclass refuses). The base arguments, when given, override
    what the recipe's `client` says. `component_rewards` is `{scorer.name: rewards}`, as UniRL's."""

    def __init__(
        self,
        *,
        config: Any,
        base_device: str | None = "cpu",
        model_name: str | None = None,
        batch_size: int | None = None,
        timeout: float | None = None,
        prompt_source: str | None = None,
        reference_key: str = "reference",
        start: bool = True,
    ) -> None:
        spec, options = managed_spec(config, base_device)
        given = {
            "model_name": model_name,
            "batch_size": batch_size,
            "timeout": timeout,
            "prompt_source": prompt_source,
        }
        options = overridden(options, reference_key, given)
        self.spec = spec
        self._set_base(options, _OurManagedBackend(spec, start=start))


class _LocalScorer(_UniRLFace):
    """One of UniRL's own local scorers (`unirl.reward.local.*`, or a user's subclass of its
    RewardBackend) in a managed child: UniRL's recipe with its top `_target_` changed to this and
    the scorer's old `_target_` as `scorer` (optional for a registry scorer: its Spec names it).
    `config` (the Spec, or its fields) and `base_device` are passed to UniRL's class in the child as
    UniRL passes them. `python_executable`: the child's python, an env with UniRL and the scorer's
    pins (default: this process's own); `extra_import_paths`: directories of a user's own scorer
    modules. `component_rewards` is `{model_name: rewards}`."""

    def __init__(
        self,
        *,
        config: Any,
        base_device: str | None = "cpu",
        scorer: str | None = None,
        python_executable: str | None = None,
        extra_import_paths: list[str] | None = None,
        input_kind: str | None = None,
        start: bool = True,
    ) -> None:
        process = {
            "python_executable": python_executable or sys.executable,
            "extra_import_paths": list(extra_import_paths or []),
        }
        spec, options = local_spec(config, base_device, scorer, process, input_kind)
        self.spec = spec
        self._set_base(options, _OurManagedBackend(spec, start=start))
        self._adopt_child_name()

    def _adopt_child_name(self) -> None:
        """The model name the child's UniRL instance gives (`get_model_name()`), once it started:
        the trainer's is a guess from the class (or from `input_kind=` alone)."""
        shape = component(self.backend).shape
        if shape is not None:
            self.model_name = shape.terms[0]

    def _answer(self, request: RewardRequest, response: RewardResponse, started: float) -> Any:
        """The scorer's one reward, as UniRL's local scorer answers it (no client's weighing), and
        `component_rewards` under its model name."""
        self._adopt_child_name()  # a backend made with start=False has started by now
        rewards = list(response.rewards)
        return unirl_response(
            rewards, {self.model_name: rewards}, response.usable(), response.errors, started
        )


class _PanelBackend(_UniRLFace):
    """A panel of this project's (a recipe of any style load_recipe reads, or a PanelConfig) as one
    UniRL reward: `config` is UniRL's RemoteRewardSpec (or a mapping of its fields), whose
    `required_rewards` picks terms of the recipe's training panel. `component_rewards[term]` is what
    the term added to each reward: weight x value, 0.0 where it does not apply or an optional term
    failed (an item's contributions sum to its reward; never a None or a NaN, which UniRL's tensors
    cannot take)."""

    def __init__(
        self,
        *,
        recipe: Any,
        config: Any = None,
        base_device: str | None = "cpu",
        model_name: str | None = None,
        batch_size: int | None = None,
        timeout: float | None = None,
        prompt_source: str | None = None,
        input_kind: str | None = None,
        reference_key: str = "reference",
    ) -> None:
        del base_device  # each term's backend names its own device in the recipe
        panel, options = panel_config(recipe, config, model_name)
        given = {
            "batch_size": batch_size,
            "timeout": timeout,
            "input_kind": input_kind,
            "prompt_source": prompt_source,
        }
        options = overridden(options, reference_key, given)
        self.panel_config = panel
        self._set_base(options, build_panel(panel))

    def _answer(self, request: RewardRequest, response: RewardResponse, started: float) -> Any:
        """The panel's reward (its recipe's weights); components are what each term added."""
        return unirl_response(
            list(response.rewards),
            contributions(self.panel.terms, request, response),
            response.usable(),
            list(response.errors),
            started,
        )

    @property
    def panel(self) -> _OurPanel:
        assert isinstance(self.backend, _OurPanel)
        return self.backend


class _RemoteBackend(_UniRLFace):
    """A managed-scorers server someone started (`serve --recipe`: a whole panel; `serve --scorer`:
    one scorer), from UniRL's remote recipe: `config` is UniRL's RemoteRewardSpec (or its fields)
    with `base_url` the server's URL (or a list of servers of one identity), `required_rewards` the
    terms wanted (the server scores only those, and a served panel's reward sums only them). The
    bearer token is read from the variable `token_env` (serve's default). `component_rewards[term]`
    is the term's value, as UniRL's own remote backend gives (0.0 where it does not apply or an
    optional term failed); the reward is the server's (a served panel's weighted reward)."""

    def __init__(
        self,
        *,
        config: Any,
        base_device: str | None = "cpu",
        token_env: str | None = "MANAGED_SCORERS_TOKEN",
        model_name: str | None = None,
        batch_size: int | None = None,
        timeout: float | None = None,
        prompt_source: str | None = None,
        reference_key: str = "reference",
    ) -> None:
        del base_device  # the server's scorers have their own devices
        remote, options, self.wanted = remote_config(config, token_env)
        given = {
            "model_name": model_name,
            "batch_size": batch_size,
            "timeout": timeout,
            "prompt_source": prompt_source,
        }
        options = overridden(options, reference_key, given)
        self._set_base(options, make_backend(remote))
        self._required = list(self.wanted)
        shape = component(self.backend).shape
        if shape is not None:  # met at construction: a wrong reward or weight is refused now
            self._weighing(shape)


_CORES: dict[str, type[_UniRLFace]] = {
    "ManagedScorerProcessBackend": _ManagedBackend,
    "ManagedLocalScorer": _LocalScorer,
    "RewardPanel": _PanelBackend,
    "RemoteRewardBackend": _RemoteBackend,
}
__all__ = [  # noqa: F822
    "ManagedLocalScorer",
    "ManagedScorerProcessBackend",
    "RemoteRewardBackend",
    "RewardPanel",
    "unirl_base",
]


def __getattr__(name: str) -> type:
    """The public classes, made once: `core` first (its methods win), UniRL's RewardBackend after
    it."""
    core = _CORES.get(name)
    if core is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    with _BUILDING:
        if name not in _BUILT:
            base = unirl_base()
            if base is not None and core is _LocalScorer:
                # before Hydra builds the recipe's nested Spec: UniRL's eager local package needs
                # every scorer's pins (torchvision), the Spec's module only its own
                bare_local_package()
            bases = (core,) if base is None else (core, base)
            _BUILT[name] = type(
                name, bases, {"__module__": __name__, "__qualname__": name, "__doc__": core.__doc__}
            )
        return _BUILT[name]
