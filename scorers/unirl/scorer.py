"""`unirl_local`: a UniRL 0.2.0 local scorer built as UniRL builds it, `Cls(config=Spec(**fields),
base_device=device)`, and called with UniRL's own RewardRequest. Its constructor loads the model:
that runs in `load()`. Onload and offload are UniRL's own (`LocalRewardBackend` moves its `model`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from scorers.base import ScoreItem, Scorer, ScoreResult, ScorerSpec
from scorers.unirl.loading import UniRLScorerError, built_spec, scorer_class, spec_class
from scorers.unirl.requests import score_result, unirl_request

NAME = "unirl_local"
KINDS = ("image", "image_edit", "video", "text")


class UniRLLocalScorer(Scorer):
    """`target`: the scorer's dotted path (a recipe's `_target_`) or UniRL's registry short name;
    `config`: the Spec's fields; `spec`: the Spec's dotted path (the config's `_target_`; default:
    the registry's, else the scorer's `config` annotation); `name`: the term (default: the scorer's
    `canonical_model_name`, else its class name)."""

    spec_per_instance = True
    spec = ScorerSpec(name=NAME, input_kind="image", terms=(NAME,))  # per instance, from the class

    def __init__(
        self,
        target: str,
        config: Mapping[str, Any] | None = None,
        spec: str | None = None,
        name: str | None = None,
    ) -> None:
        if not isinstance(target, str) or not target:
            raise UniRLScorerError(f"{NAME}: target must be a UniRL scorer's dotted path or name")
        self.target, self.fields = target, dict(config or {})
        self.cls = scorer_class(target)
        self.spec_cls = spec_class(target, self.cls, spec)
        built_spec(target, self.spec_cls, self.fields)  # refused at boot, before any weights load
        kind = str(getattr(self.cls, "input_kind", "image") or "image").lower()
        if kind not in KINDS:
            raise UniRLScorerError(f"UniRL scorer {target!r} takes {kind!r}; supported: {KINDS}")
        term = name or getattr(self.cls, "canonical_model_name", None) or self.cls.__name__.lower()
        self.term, self._named = str(term), name is not None
        self.spec = ScorerSpec(
            name=NAME,
            input_kind=kind,
            terms=(self.term,),
            revision="unirl-0.2",
            env="trl",
            supports_offload=True,
            identity={"target": f"{self.cls.__module__}.{self.cls.__qualname__}"},
            report_packages=("unirl",),
            requires_modules=("unirl", "torch"),
        )
        self._backend: Any = None

    def load(self, device: str = "cpu") -> None:
        """UniRL's own construction, which loads the model onto `device` (its `base_device`); then
        UniRL's offload unless the host onloads it right after (the host starts every scorer
        offloaded: its residency and the model's agree). The term is the instance's model name
        (UniRL's `get_model_name()`) unless `name` is given. A video scorer that covers the prompt
        (UniRL's `covers_prompt_video`, or one that does not say: UniRL checks none then) requires
        it, which is how the drop-in answers UniRL's RewardService the same."""
        backend = self.cls(
            config=built_spec(self.target, self.spec_cls, self.fields), base_device=device
        )
        self._backend = backend
        if not self.boots_resident:
            backend.offload()
        if not self._named:  # UniRL's own name for it: the instance's (VideoRewardScorer's model)
            self.term = str(backend.get_model_name() or self.term)
        covers = getattr(backend, "covers_prompt_video", None)
        prompt = self.spec.input_kind == "video" and (covers is None or covers())
        self.spec = dataclasses.replace(
            self.spec,
            terms=(self.term,),
            required_fields=("prompt",) if prompt else self.spec.required_fields,
        )

    def _live(self) -> Any:
        if self._backend is None:
            raise RuntimeError(f"{NAME} {self.target!r}: used before load()")
        return self._backend

    def onload(self) -> dict[str, Any]:
        self._live().onload()
        return {}

    def offload(self) -> dict[str, Any]:
        if self._backend is not None:
            self._backend.offload()
        return {}

    def score(self, items: Sequence[ScoreItem]) -> ScoreResult:
        response = self._live().compute_rewards(unirl_request(self.spec.input_kind, items))
        return score_result(self.term, response, len(items))

    def close(self) -> None:
        """UniRL's terminal hook, once."""
        backend, self._backend = self._backend, None
        if backend is not None:
            backend.dispose()
