"""A UniRL 0.2.0 local-scorer recipe (`_target_: unirl.reward.local.<module>.<Scorer>`,
`config: <Spec>`, `base_device`) read into this project's managed config: the child runs
`scorers.unirl.scorer` (UniRL's class, built as UniRL builds it) from an env that has UniRL and the
scorer's pins.

`config` is the Spec Hydra built (a dataclass), or a mapping of its fields (its `_target_`, when
there, names the Spec). The scorer is `scorer=` (the recipe's old `_target_`, or a registry short
name); without it, the registry scorer of the config's Spec. The input kind is the scorer class's
own, read here by importing only its module (`scorers.unirl.loading`), unless `input_kind=` says it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from scorers.unirl.loading import UniRLScorerError, scorer_class, scorer_for_spec
from supervisor.adapters.unirl_config import TARGET, UniRLOptions, plain
from supervisor.config import ManagedScorerProcessSpec
from supervisor.errors import ConfigError, validation_message

UNIRL_SCORER = "scorers.unirl.scorer:UniRLLocalScorer"


def spec_fields(config: Any) -> tuple[dict[str, Any], str | None]:
    """The Spec's fields and its dotted path (None: not said) from a dataclass or a mapping."""
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        kind = type(config)
        fields = {f.name: plain(getattr(config, f.name)) for f in dataclasses.fields(config)}
        return fields, f"{kind.__module__}.{kind.__qualname__}"
    if config is None or isinstance(config, Mapping):
        fields = plain(dict(config or {}))
        path = fields.pop(TARGET, None)
        return fields, None if path is None else str(path)
    raise ConfigError(
        f"config must be the UniRL scorer's Spec (a dataclass) or a mapping of its fields, "
        f"got {type(config).__name__}"
    )


def _scorer_facts(target: str, input_kind: str | None) -> tuple[str, str]:
    """(model name, input kind): the class's own, imported here; `input_kind` when given."""
    try:
        cls = scorer_class(target)
    except UniRLScorerError as exc:
        if input_kind is None:
            raise ConfigError(
                f"{exc}; give input_kind= (image, video or text) to start the child without "
                "importing the scorer here"
            ) from exc
        return target.rpartition(".")[2].lower(), input_kind
    name = getattr(cls, "canonical_model_name", None) or cls.__name__.lower()
    return str(name), input_kind or str(getattr(cls, "input_kind", "image") or "image")


def local_spec(
    config: Any,
    base_device: str | None,
    scorer: str | None,
    process: Mapping[str, Any],
    input_kind: str | None,
) -> tuple[ManagedScorerProcessSpec, UniRLOptions]:
    """Our managed config for the scorer, and UniRL's base options (from the Spec's fields)."""
    fields, spec_path = spec_fields(config)
    if scorer is None:
        if spec_path is None:
            raise ConfigError("name the UniRL scorer (scorer=) or give its Spec as config")
        try:
            scorer = scorer_for_spec(spec_path)
        except UniRLScorerError as exc:
            raise ConfigError(str(exc)) from exc
    name, kind = _scorer_facts(scorer, input_kind)
    # the child names the term after UniRL's instance (`get_model_name()`); `name` is a guess
    params = {"target": scorer, "config": fields, "spec": spec_path}
    ours = {
        "process": dict(process),
        "scorer": {
            "name": UNIRL_SCORER,
            "input_kind": kind,
            "params": params,
            "device": base_device or "cpu",
        },
    }
    try:
        spec = ManagedScorerProcessSpec.model_validate(ours)
    except ValidationError as exc:
        raise ConfigError(f"UniRL scorer {scorer!r}: {validation_message(exc)}") from exc
    options = UniRLOptions(
        model_name=name,
        batch_size=int(fields.get("batch_size") or 8),
        prompt_source=str(fields.get("prompt_source") or "generation"),
        input_kind=kind,
    )
    return spec, options
