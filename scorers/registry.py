"""Scorer names: built-ins (lowercase name -> lazy dotted path), custom catalogs, and dotted paths.

A custom catalog is a zero-argument factory, importable by dotted path
(`my_pkg.rewards:catalog`), returning `{name: Scorer subclass or "module:Class"}`. It may
add names but never override a built-in. Parent (preflight) and child resolve names
through the same catalog path, so both sides mean the same scorer by a name.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

from scorers.base import Scorer

BUILTINS: dict[str, str] = {
    "math_verify": "scorers.math_verify:MathVerifyScorer",
    "jpeg_compressibility": "scorers.jpeg:JpegCompressibility",
    "jpeg_incompressibility": "scorers.jpeg:JpegIncompressibility",
    "exact_match": "scorers.rules:ExactMatch",
    "nonempty": "scorers.rules:NonEmpty",
    "constant": "scorers.rules:Constant",
    "mean_intensity": "scorers.rules:MeanIntensity",
    "edit_fidelity": "scorers.image_edit:EditFidelity",
    "token_f1": "scorers.rules:TokenF1",
    "gsm8k": "scorers.task_rules:Gsm8k",
    "countdown": "scorers.task_rules:Countdown",
    "arithmetic": "scorers.task_rules:Arithmetic",
    "format_reward": "scorers.task_rules:FormatReward",
    "pairwise_judge": "scorers.pairwise:PairwiseJudge",
    "llm_judge": "scorers.llm_judge:LlmJudge",
    "text_similarity": "scorers.text_similarity:TextSimilarity",
    "clip_preference": "scorers.clip_preference:ClipPreference",
    "torch_probe": "scorers.torch_probe:TorchProbe",
    "ocr": "scorers.ocr:OcrScorer",
    "video": "scorers.video:VideoScorer",
    "audio_loudness": "scorers.audio:AudioLoudness",
}


class UnknownScorerError(LookupError):
    """The name is neither registered nor an importable `module:Class` path."""


class CatalogError(LookupError):
    """A custom catalog cannot be imported, breaks the factory contract, or overrides a built-in."""


def registered_names() -> list[str]:
    return sorted(BUILTINS)


def import_dotted(path: str, what: str, error: type[Exception]) -> Any:
    """The object at `module:attr` (or `module.attr`); any failure is `error`, naming `what`."""
    module_name, _, attr = path.partition(":") if ":" in path else path.rpartition(".")
    if not module_name or not attr:
        raise error(f"{what}: {path!r} is not a dotted path like 'my_pkg.module:Name'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise error(f"{what}: cannot import module {module_name!r}: {exc}") from exc
    try:
        return getattr(module, attr)
    except AttributeError as exc:
        raise error(f"{what}: module {module_name!r} has no {attr!r}") from exc


def load_catalog(path: str | None) -> dict[str, str | type[Scorer]]:
    """The custom entries of the catalog factory at `path` (none when `path` is None)."""
    if path is None:
        return {}
    factory = import_dotted(path, f"catalog {path!r}", CatalogError)
    if not callable(factory):
        raise CatalogError(f"catalog {path!r} is not a zero-argument factory")
    try:
        entries = factory()
    except TypeError as exc:
        raise CatalogError(f"catalog {path!r}: the factory must take no arguments ({exc})") from exc
    if not isinstance(entries, Mapping):
        raise CatalogError(f"catalog {path!r} returned {type(entries).__name__}, expected a mapping of names")
    catalog: dict[str, str | type[Scorer]] = {}
    for name, entry in entries.items():
        if not isinstance(name, str) or name != name.lower() or not name.isidentifier():
            raise CatalogError(f"catalog {path!r}: name {name!r} must be a lowercase identifier")
        if name in BUILTINS:
            raise CatalogError(f"catalog {path!r}: {name!r} is a built-in scorer and cannot be overridden")
        if not (isinstance(entry, str) or (isinstance(entry, type) and issubclass(entry, Scorer))):
            raise CatalogError(f"catalog {path!r}: {name!r} must map to a Scorer subclass or a 'module:Class' path")
        catalog[name] = entry
    return catalog


def resolve_scorer(name: str, catalog: str | None = None) -> type[Scorer]:
    """The scorer class for a built-in name, a name in the custom `catalog`, or a `module:Class` path."""
    custom = load_catalog(catalog)  # checked whatever the name: a catalog never overrides a built-in
    entry: str | type[Scorer] | None = BUILTINS.get(name.lower()) or custom.get(name)
    if entry is None:
        if "." not in name and ":" not in name:
            where = f", catalog {catalog!r}" if catalog else ""
            raise UnknownScorerError(
                f"unknown scorer {name!r}; registered: {', '.join(registered_names())}{where}; "
                "or give a dotted path like 'my_pkg.rewards:MyScorer'"
            )
        entry = name
    cls = import_dotted(entry, f"scorer {name!r}", UnknownScorerError) if isinstance(entry, str) else entry
    if not (isinstance(cls, type) and issubclass(cls, Scorer)):
        raise UnknownScorerError(f"scorer {name!r}: {entry!r} is not a Scorer subclass")
    return cls
