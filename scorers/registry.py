"""Scorer names: built-ins (lowercase name -> lazy dotted path), custom catalogs, and dotted paths.

A custom catalog is a zero-argument factory, importable by dotted path
(`my_pkg.rewards:catalog`), returning `{name: Scorer subclass or "module:Class"}`. It may
add names but never override a built-in. Parent (preflight) and child resolve names
through the same catalog path, so both sides mean the same scorer by a name.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
from collections.abc import Iterable, Mapping
from typing import Any

from scorers.base import Scorer, ScorerSpec

BUILTINS: dict[str, str] = {
    "math_verify": "scorers.builtin.math_verify:MathVerifyScorer",
    "jpeg_compressibility": "scorers.builtin.jpeg:JpegCompressibility",
    "jpeg_incompressibility": "scorers.builtin.jpeg:JpegIncompressibility",
    "exact_match": "scorers.builtin.rules:ExactMatch",
    "nonempty": "scorers.builtin.rules:NonEmpty",
    "constant": "scorers.builtin.rules:Constant",
    "mean_intensity": "scorers.builtin.rules:MeanIntensity",
    "edit_fidelity": "scorers.builtin.image_edit:EditFidelity",
    "token_f1": "scorers.builtin.rules:TokenF1",
    "gsm8k": "scorers.builtin.task_rules:Gsm8k",
    "countdown": "scorers.builtin.task_rules:Countdown",
    "arithmetic": "scorers.builtin.task_rules:Arithmetic",
    "format_reward": "scorers.builtin.task_rules:FormatReward",
    "pairwise_judge": "scorers.builtin.pairwise:PairwiseJudge",
    "llm_judge": "scorers.builtin.llm_judge:LlmJudge",
    "text_similarity": "scorers.builtin.text_similarity:TextSimilarity",
    "clip_preference": "scorers.builtin.clip_preference:ClipPreference",
    "torch_probe": "scorers.builtin.torch_probe:TorchProbe",
    "ocr": "scorers.builtin.ocr:OcrScorer",
    "video": "scorers.builtin.video:VideoScorer",
    "audio_loudness": "scorers.builtin.audio:AudioLoudness",
    "code_exec": "scorers.builtin.code_exec:CodeExec",
}


class UnknownScorerError(LookupError):
    """The name is neither registered nor an importable `module:Class` path."""


class CatalogError(LookupError):
    """A custom catalog cannot be imported, breaks the factory contract, or overrides a built-in."""


def registered_names() -> list[str]:
    return sorted(BUILTINS)


def nearest(name: str, choices: Iterable[str]) -> str:
    """ " (did you mean 'x'?)" for the closest of `choices` to a misspelt `name` (difflib), else
    ""."""
    close = difflib.get_close_matches(name, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def declared_spec(name: str, catalog: str | None = None) -> ScorerSpec | None:
    """The spec a scorer class declares, where the name resolves here; None where only its env can
    import it (its child then says). What the parent infers from it (env, input kind) is a
    default."""
    try:
        cls = resolve_scorer(name, catalog)
    except (LookupError, ImportError):
        return None
    # its class spec is a placeholder: the instance's is made from params
    if getattr(cls, "spec_per_instance", False):
        return None
    # not a property's value: that would build nothing here
    spec = inspect.getattr_static(cls, "spec", None)
    return spec if isinstance(spec, ScorerSpec) else None


def param_names(cls: type[Scorer]) -> list[str] | None:
    """The params a scorer's constructor takes by name; None when it takes any (`**kwargs`)."""
    parameters = list(inspect.signature(cls.__init__).parameters.values())[1:]  # past self
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return None
    named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return [p.name for p in parameters if p.kind in named]


def unknown_params(cls: type[Scorer], params: Mapping[str, Any]) -> str | None:
    """What is wrong with `params`' names for `cls` (each unknown one, its nearest, the valid ones),
    or None."""
    accepted = param_names(cls)
    if accepted is None:
        return None
    unknown = [key for key in params if key not in accepted]
    if not unknown:
        return None
    named = ", ".join(f"{key!r}{nearest(key, accepted)}" for key in unknown)
    valid = ", ".join(accepted) if accepted else "none"
    return f"unknown param{'s' if len(unknown) > 1 else ''} {named}; its params: {valid}"


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
        raise CatalogError(
            f"catalog {path!r} returned {type(entries).__name__}, expected a mapping of names"
        )
    catalog: dict[str, str | type[Scorer]] = {}
    for name, entry in entries.items():
        if not isinstance(name, str) or name != name.lower() or not name.isidentifier():
            raise CatalogError(f"catalog {path!r}: name {name!r} must be a lowercase identifier")
        if name in BUILTINS:
            raise CatalogError(
                f"catalog {path!r}: {name!r} is a built-in scorer and cannot be overridden"
            )
        if not (isinstance(entry, str) or (isinstance(entry, type) and issubclass(entry, Scorer))):
            raise CatalogError(
                f"catalog {path!r}: {name!r} must map to a Scorer subclass or a 'module:Class' path"
            )
        catalog[name] = entry
    return catalog


def resolve_scorer(name: str, catalog: str | None = None) -> type[Scorer]:
    """The scorer class for a built-in name, a name in the custom `catalog`, or a `module:Class`
    path."""
    # checked whatever the name: a catalog never overrides a built-in
    custom = load_catalog(catalog)
    entry: str | type[Scorer] | None = BUILTINS.get(name.lower()) or custom.get(name)
    if entry is None:
        if "." not in name and ":" not in name:
            where = f", catalog {catalog!r}" if catalog else ""
            raise UnknownScorerError(
                f"unknown scorer {name!r}{nearest(name, [*BUILTINS, *custom])}; registered: "
                f"{', '.join(registered_names())}{where}; "
                "or give a dotted path like 'my_pkg.rewards:MyScorer'"
            )
        entry = name
    cls = (
        import_dotted(entry, f"scorer {name!r}", UnknownScorerError)
        if isinstance(entry, str)
        else entry
    )
    if not (isinstance(cls, type) and issubclass(cls, Scorer)):
        raise UnknownScorerError(f"scorer {name!r}: {entry!r} is not a Scorer subclass")
    return cls
