"""A scorer built around an inner scorer (video frames, a pairwise judge): one place that carries
the inner scorer's lifecycle and what its spec says about the env, residency and identity."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from scorers.base import Scorer, ScorerSpec
from scorers.identity import scorer_document
from scorers.registry import resolve_scorer


class WrappingScorer(Scorer):
    """Builds `inner` by name; `wrapped_spec` gives the wrapper's spec with the inner one's env,
    offload support, packages, input handling and identity carried over."""

    def __init__(self, inner: str, inner_params: Mapping[str, Any] | None = None) -> None:
        self.inner_params = dict(inner_params or {})
        self.inner = resolve_scorer(inner)(**self.inner_params)

    def wrapped_spec(self, *, name: str, revision_prefix: str, **fields: Any) -> ScorerSpec:
        inner = self.inner.spec
        return ScorerSpec(
            name=name,
            revision=f"{revision_prefix}[{inner.name}@{inner.revision}]",
            env=inner.env,
            supports_offload=inner.supports_offload,
            report_packages=inner.report_packages,
            writable_inputs=inner.writable_inputs,
            identity={"inner": scorer_document(self.inner, self.inner_params)},
            requires_modules=inner.requires_modules,
            **fields,
        )

    def load(self, device: str = "cpu") -> None:
        self.inner.load(device)

    def warming(self) -> bool:
        return self.inner.warming()

    def onload(self) -> dict[str, Any]:
        return self.inner.onload()

    def offload(self) -> dict[str, Any]:
        return self.inner.offload()

    def close(self) -> None:
        self.inner.close()
