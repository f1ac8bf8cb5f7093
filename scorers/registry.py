"""Lowercase scorer names -> lazy dotted paths, with a dotted-path fallback for user scorers."""

from __future__ import annotations

import importlib

from scorers.base import Scorer

_REGISTRY: dict[str, str] = {
    "math_verify": "scorers.math_verify:MathVerifyScorer",
    "jpeg_compressibility": "scorers.jpeg:JpegCompressibility",
    "jpeg_incompressibility": "scorers.jpeg:JpegIncompressibility",
    "exact_match": "scorers.rules:ExactMatch",
    "nonempty": "scorers.rules:NonEmpty",
    "constant": "scorers.rules:Constant",
    "mean_intensity": "scorers.rules:MeanIntensity",
    "text_similarity": "scorers.text_similarity:TextSimilarity",
    "ocr": "scorers.ocr:OcrScorer",
    "video": "scorers.video:VideoScorer",
}


class UnknownScorerError(LookupError):
    """The name is neither registered nor an importable `module:Class` path."""


def registered_names() -> list[str]:
    return sorted(_REGISTRY)


def resolve_scorer(name: str) -> type[Scorer]:
    """Return the scorer class for a registered name or a `pkg.module:Class` / `pkg.module.Class` path."""
    path = _REGISTRY.get(name.lower())
    if path is None:
        if "." not in name and ":" not in name:
            raise UnknownScorerError(
                f"unknown scorer {name!r}; registered: {', '.join(registered_names())}; "
                "or give a dotted path like 'my_pkg.rewards:MyScorer'"
            )
        path = name
    module_name, _, attr = path.partition(":") if ":" in path else path.rpartition(".")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise UnknownScorerError(f"scorer {name!r}: cannot import module {module_name!r}: {exc}") from exc
    cls = getattr(module, attr, None)
    if not (isinstance(cls, type) and issubclass(cls, Scorer)):
        raise UnknownScorerError(f"scorer {name!r}: {path!r} is not a Scorer subclass")
    return cls
