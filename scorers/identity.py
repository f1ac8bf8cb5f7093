"""Catalog identity: a canonical SHA-256 over what decides a scorer's verdicts.

Name, revision, input kind, term and diagnostic names, the optional semantic identity,
and the params that change verdicts or failure behaviour (timeouts, `on_timeout`): all
of a scorer's params with their defaults applied, except those it declares
non-semantic (a worker count). A credential *reference* (an env var name) is a param
like any other; a secret value must never be one. Stdlib only.
"""

from __future__ import annotations

import hashlib
import inspect
import json
from collections.abc import Callable, Mapping
from typing import Any


def canonical_json(value: Any, allow_nan: bool = False) -> bytes:
    """The one canonical JSON of the project: sorted keys, no spaces, UTF-8 (hashed, compared)."""
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=allow_nan
    ).encode()


def digest(document: Any, allow_nan: bool = False) -> str:
    """sha256 of the canonical JSON: identities, a dataset row's content, the ranks' signature."""
    return hashlib.sha256(canonical_json(document, allow_nan)).hexdigest()


def jsonable(value: Any) -> Any:
    """The value if JSON can carry it, else its repr (an identity must always be computable)."""
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        return repr(value)
    return value


def effective_params(cls: Callable[..., Any], params: Mapping[str, Any]) -> dict[str, Any]:
    """`params` bound to the constructor, defaults applied (so passing a default changes
    nothing)."""
    try:
        bound = inspect.signature(cls).bind(**params)
    except (TypeError, ValueError):
        return {key: jsonable(value) for key, value in params.items()}
    bound.apply_defaults()
    effective: dict[str, Any] = {}
    for name, value in bound.arguments.items():
        kind = inspect.signature(cls).parameters[name].kind
        if kind is inspect.Parameter.VAR_KEYWORD:
            effective.update({key: jsonable(item) for key, item in value.items()})
        elif kind is not inspect.Parameter.VAR_POSITIONAL:
            effective[name] = jsonable(value)
    return effective


def scorer_document(scorer: Any, params: Mapping[str, Any]) -> dict[str, Any]:
    """What the identity hash covers, for a constructed scorer (wrappers set their spec per
    instance)."""
    spec = scorer.spec
    semantic = {
        k: v for k, v in scorer.identity_params(params).items() if k not in spec.nonsemantic_params
    }
    document = {
        "name": spec.name,
        "revision": spec.revision,
        "input_kind": spec.input_kind,
        "terms": list(spec.term_names()),
        "diagnostics": sorted(spec.diagnostics),
        "groupwise": spec.groupwise,
        "ragged_groups": spec.ragged_groups,
        "identity": spec.identity,
        "params": semantic,
    }
    if spec.details:  # named only where declared: every other scorer keeps its hash
        document["details"] = sorted(spec.details)
    return document


def scorer_identity_hash(scorer: Any, params: Mapping[str, Any]) -> str:
    return digest(scorer_document(scorer, params))
