"""preflight(recipe): everything that can be checked before model setup, without starting a
process, loading weights or reaching a server.

For every term: the scorer name resolves (built-in, custom catalog, dotted path); its
params construct it (constructors are cheap and side-effect free by contract); the
configured revision and identity hash pins match; required rewards, weights and the
term's `component` name declared terms. For a managed child: its env exists, is a venv
of Python 3.11+, and its site-packages hold what the scorer imports (`requires_modules`)
and what the child runtime needs. Every problem is named; nothing is fixed silently.
"""

from __future__ import annotations

import contextlib
import importlib.machinery
import os
import re
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from scorers.base import Scorer, ScorerSpec
from scorers.identity import scorer_identity_hash
from scorers.registry import CatalogError, UnknownScorerError, resolve_scorer, unknown_params
from supervisor.child.import_root import CHILD_PACKAGES
from supervisor.compose.recipes import Recipe, load_recipe
from supervisor.config import (
    BackendConfig,
    JobBackendConfig,
    LocalBackendConfig,
    ManagedScorerProcessSpec,
    PanelConfig,
    RemoteBackendConfig,
    ScorerConfig,
)
from supervisor.errors import ConfigError

CHILD_RUNTIME_MODULES = ("numpy", "starlette", "uvicorn")


class PreflightError(ConfigError):
    """The recipe cannot run; `problems` lists every reason, each naming where."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("preflight found problems:\n  - " + "\n  - ".join(problems))
        self.problems = problems


@dataclass
class PreflightReport:
    problems: list[str] = field(default_factory=list)
    # what only the child can check (a module in its env alone)
    notes: list[str] = field(default_factory=list)
    # term -> scorer, revision, identity hash (validation terms as `validation.<term>`)
    scorers: dict[str, dict[str, Any]] = field(default_factory=dict)
    # place -> the spec its scorer declared here
    specs: dict[str, ScorerSpec] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.problems


def preflight(
    recipe: str | os.PathLike[str] | Mapping[str, Any] | Recipe, raise_on_problems: bool = True
) -> PreflightReport:
    report = PreflightReport()
    try:
        parsed = recipe if isinstance(recipe, Recipe) else load_recipe(recipe)
    except ConfigError as exc:
        # load_recipe's one-line error over what the models refused: each, by term
        cause = exc.__cause__
        if isinstance(cause, ValidationError):
            report.problems.extend(_validation_problems(cause, _term_places(recipe)))
        else:
            report.problems.append(str(exc))
    else:
        for where, panel in (("reward", parsed.train), ("validation", parsed.validation)):
            if panel is not None:
                _check_panel(panel, where, report)
    if report.problems and raise_on_problems:
        raise PreflightError(report.problems)
    return report


def _term_places(recipe: Any) -> list[str]:
    """`reward.<term name>` for each term of the training panel, where the recipe's own mapping says
    so unambiguously (a `terms:` list; verl-omni `reward_functions` without validation
    functions)."""
    if not isinstance(recipe, Mapping):
        return []
    terms, reward = recipe.get("terms"), recipe.get("reward")
    if isinstance(terms, list):
        names = [term.get("name") if isinstance(term, Mapping) else None for term in terms]
        return [f"reward.{name}" if isinstance(name, str) and name else "" for name in names]
    if isinstance(reward, Mapping) and isinstance(reward.get("reward_functions"), Mapping):
        if not reward.get("val_reward_functions"):
            return [f"reward.{name}" for name in reward["reward_functions"]]
    return []


def _validation_problems(exc: ValidationError, places: list[str]) -> list[str]:
    """One problem per validation error, naming its term (`terms.<i>` -> `reward.<name>`) where
    known."""
    problems = []
    for error in exc.errors():
        loc = [str(part) for part in error["loc"]]
        index = (
            int(loc[1]) if len(loc) >= 2 and loc[0] == "terms" and loc[1].isdigit() else len(places)
        )
        if index < len(places) and places[index]:
            problems.append(
                ": ".join([places[index], *([".".join(loc[2:])] if loc[2:] else []), error["msg"]])
            )
        else:
            problems.append(f"{'.'.join(loc)}: {error['msg']}" if loc else error["msg"])
    return problems


def _check_panel(panel: PanelConfig, where: str, report: PreflightReport) -> None:
    for term in panel.terms:
        _check_backend(term.backend, f"{where}.{term.name}", report, term.component)


def check_backend(backend: BackendConfig, place: str) -> PreflightReport:
    """One backend's checks (`serve --scorer`'s spec), its problems named by `place`; never
    raises."""
    report = PreflightReport()
    _check_backend(backend, place, report)
    return report


def _check_backend(
    backend: BackendConfig, place: str, report: PreflightReport, component: str | None = None
) -> None:
    # nothing of ours to check but the token
    if isinstance(backend, (RemoteBackendConfig, JobBackendConfig)):
        if backend.token_env is not None and not os.environ.get(backend.token_env):
            report.problems.append(
                f"{place}: environment variable {backend.token_env} (the token) is not set"
            )
        return
    search = (
        _env_search(backend, place, report)
        if isinstance(backend, ManagedScorerProcessSpec)
        else None
    )
    checked = _check_scorer(backend, place, report, search)
    if checked is None:
        return
    terms, requires = checked
    if component is not None and component not in terms:
        report.problems.append(
            f"{place}: component {component!r} is not a term of the scorer ({list(terms)})"
        )
    unknown = sorted(
        (set(backend.client.required_rewards) | set(backend.client.weights)) - set(terms)
    )
    if unknown:
        report.problems.append(
            f"{place}: required_rewards/weights {unknown} are not terms of the scorer "
            f"({list(terms)})"
        )
    if isinstance(backend, ManagedScorerProcessSpec) and search is not None:
        _check_env_modules(backend, place, report, requires, search)


def _check_scorer(
    backend: LocalBackendConfig | ManagedScorerProcessSpec,
    place: str,
    report: PreflightReport,
    search: list[str] | None = None,
) -> tuple[tuple[str, ...], tuple[str, ...]] | None:
    """The scorer's terms and the modules it needs from its env; None (and a problem) if
    unusable."""
    built = _build_scorer(backend, place, report, search)
    if built is None:
        return None
    spec, identity = built
    report.specs[place] = spec
    where, _, term = place.partition(".")
    report.scorers[term if where == "reward" else place] = {
        "scorer": spec.name,
        "revision": spec.revision,
        "identity_hash": identity,
    }
    _check_against_config(backend, spec, identity, place, report)
    return spec.term_names(), spec.requires_modules


def _build_scorer(
    backend: LocalBackendConfig | ManagedScorerProcessSpec,
    place: str,
    report: PreflightReport,
    search: list[str] | None,
) -> tuple[ScorerSpec, str] | None:
    """The scorer's spec and identity hash, built here as its child would build it; None (with a
    problem, or a note when only its env can import it) when it cannot be built here."""
    config = backend.scorer
    process = backend.process if isinstance(backend, ManagedScorerProcessSpec) else None
    extra = [str(p) for p in process.extra_import_paths] if process else []
    added = [p for p in extra if p not in sys.path]
    # the child gets them too; the scorer's spec is read from the same modules
    sys.path.extend(added)
    try:
        # built and hashed in the environment its child will have (a param it resolves from the
        # environment, such as $MATH_VERIFY_TIMEOUT_S, may be set for the child in process.env)
        with _environ(process.env if process else {}):
            built = _construct(config, place, report)
    except (UnknownScorerError, CatalogError) as exc:
        _unresolved(backend, place, report, search, exc)
        return None
    except (TypeError, ValueError) as exc:
        report.problems.append(f"{place}: scorer {config.name!r} params: {exc}")
        return None
    except Exception as exc:  # noqa: BLE001 - a constructor or catalog factory that fails otherwise is named too
        report.problems.append(
            f"{place}: scorer {config.name!r} cannot be built: {type(exc).__name__}: {exc}"
        )
        return None
    finally:
        for path in added:
            sys.path.remove(path)
    if built is None:
        return None
    scorer, identity = built
    return scorer.spec, identity


def _construct(
    config: ScorerConfig, place: str, report: PreflightReport
) -> tuple[Scorer, str] | None:
    """The scorer constructed from its params, and its identity hash; None (with a problem) for
    params it does not take."""
    cls = resolve_scorer(config.name, config.catalog)
    # named with the valid ones, not a TypeError's words
    unknown = unknown_params(cls, config.params)
    if unknown is not None:
        report.problems.append(f"{place}: scorer {config.name!r} params: {unknown}")
        return None
    scorer = cls(**config.params)
    return scorer, scorer_identity_hash(scorer, config.params)


def _unresolved(
    backend: LocalBackendConfig | ManagedScorerProcessSpec,
    place: str,
    report: PreflightReport,
    search: list[str] | None,
    exc: UnknownScorerError | CatalogError,
) -> None:
    """A scorer that does not resolve here: a note when its module lives in its env alone (its env
    checked instead), else a problem."""
    env_only = (
        search is not None and isinstance(exc.__cause__, ImportError) and _env_only(backend, search)
    )
    if isinstance(backend, ManagedScorerProcessSpec) and search is not None and env_only:
        # the scorer's module lives in its env alone (the reason for a managed child): its spec,
        # terms and pins are the child's to check at start; the env itself is checked below
        report.notes.append(f"{place}: {exc.__cause__}; checked by the child at start, not here")
        _check_env_modules(backend, place, report, (), search)
    else:
        report.problems.append(f"{place}: {exc}")


def _check_against_config(
    backend: LocalBackendConfig | ManagedScorerProcessSpec,
    spec: ScorerSpec,
    identity: str,
    place: str,
    report: PreflightReport,
) -> None:
    """The config's pins, input kind and residency, held against the scorer as it was built."""
    config = backend.scorer
    if config.revision is not None and config.revision != spec.revision:
        report.problems.append(
            f"{place}: revision pin {config.revision!r}, but scorer {spec.name!r} is "
            f"{spec.revision!r}"
        )
    if config.identity_hash is not None and config.identity_hash != identity:
        report.problems.append(
            f"{place}: identity_hash pin {config.identity_hash}, but scorer {spec.name!r} "
            f"with these params is {identity}"
        )
    if config.input_kind != spec.input_kind:
        report.problems.append(
            f"{place}: input_kind {config.input_kind!r}, but scorer {spec.name!r} takes "
            f"{spec.input_kind!r}"
        )
    if isinstance(backend, ManagedScorerProcessSpec) and backend.gpu_residency == "per_call":
        if not spec.supports_offload:
            report.problems.append(
                f"{place}: gpu_residency per_call (offload: true) needs a scorer that can offload; "
                f"{spec.name!r} cannot (use resident)"
            )


@contextlib.contextmanager
def _environ(overlay: Mapping[str, str]) -> Iterator[None]:
    """os.environ with `overlay` set over it, restored afterwards."""
    saved = {key: os.environ.get(key) for key in overlay}
    os.environ.update(overlay)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _env_search(
    spec: ManagedScorerProcessSpec, place: str, report: PreflightReport
) -> list[str] | None:
    """Where the child will import from (its venv's site-packages, then extra_import_paths);
    None, with a problem, when the python is not a usable venv."""
    python = spec.process.python_executable
    cfg = python.parent.parent / "pyvenv.cfg"
    try:
        text = cfg.read_text()
    except OSError:
        report.problems.append(
            f"{place}: {python} is not a venv's python (no {cfg}); build it with "
            f"`managed-scorers envs build NAME`"
        )
        return None
    match = re.search(r"^version(?:_info)?\s*=\s*(\d+)\.(\d+)", text, re.MULTILINE)
    if match is None or (int(match[1]), int(match[2])) < (3, 11):
        found = f"{match[1]}.{match[2]}" if match else "unknown"
        report.problems.append(f"{place}: the env's Python is {found}; the child needs 3.11+")
        return None
    version = f"python{match[1]}.{match[2]}"
    roots = [python.parent.parent / lib / version / "site-packages" for lib in ("lib", "lib64")]
    return [str(p) for p in roots if p.is_dir()] + [str(p) for p in spec.process.extra_import_paths]


def _custom_modules(spec: ManagedScorerProcessSpec | LocalBackendConfig) -> list[tuple[str, str]]:
    """(top-level module, dotted path) of a dotted-path scorer and of a custom catalog."""
    found = []
    for dotted in (spec.scorer.name, spec.scorer.catalog):
        if dotted is None or ("." not in dotted and ":" not in dotted):
            continue  # a built-in or catalog name: our own packages, always on the child's path
        top = dotted.partition(":")[0].split(".")[0]
        if top not in CHILD_PACKAGES:
            found.append((top, dotted))
    return found


def _env_only(spec: ManagedScorerProcessSpec | LocalBackendConfig, search: list[str]) -> bool:
    modules = _custom_modules(spec)
    return bool(modules) and all(
        importlib.machinery.PathFinder.find_spec(top, search) for top, _ in modules
    )


def _check_env_modules(
    spec: ManagedScorerProcessSpec,
    place: str,
    report: PreflightReport,
    requires: tuple[str, ...],
    search: list[str],
) -> None:
    env = spec.process.python_executable.parent.parent
    for module in (*CHILD_RUNTIME_MODULES, *requires):
        if importlib.machinery.PathFinder.find_spec(module, search) is None:
            report.problems.append(f"{place}: the env {env} cannot import {module!r}")
    for top, dotted in _custom_modules(spec):
        if importlib.machinery.PathFinder.find_spec(top, search) is None:
            report.problems.append(
                f"{place}: the child cannot import {top!r} (from {dotted!r}): list its "
                f"directory in "
                "process.extra_import_paths"
            )
