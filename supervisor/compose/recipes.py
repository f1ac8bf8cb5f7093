"""Reward recipes in the styles users of the four seed systems already write, all built into
one `PanelConfig` and one `RewardPanel` (one runtime, several authoring styles):

- UniRL / Hydra: a `_target_` tree of config classes (`supervisor.PanelConfig`, ...);
- verl-omni: `reward.models` (deployments) and `reward.reward_functions` (terms that bind a
  model by name, with `weight` and `required`); a `backend: native` model runs its class and
  the score functions bound to it in its own children (`compose/native_recipe`);
- Posttrain: a zero-argument catalog factory (`catalog:`) and `reward:` / `validation:`
  selecting a provider from it by name;
- FF: a `rewards:` list (and `eval_rewards:`) of model classes or registered scorers
  (`compose/ff_recipe`).

`load_recipe` only parses and validates: it imports config classes and catalog factories
but starts nothing. `build_panels` starts the backends (one per distinct configuration,
shared by every term and panel through one `BackendPool`).
"""

from __future__ import annotations

import dataclasses
import difflib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from scorers.registry import import_dotted
from supervisor.backend import RewardBackend
from supervisor.compose.batch_view import shared_key, term_backend
from supervisor.compose.engine_recipe import (
    engine_backends,
    engine_terms,
    is_engine,
    with_defaults,
)
from supervisor.compose.ff_recipe import ff_panels
from supervisor.compose.native_recipe import check_pool, is_native, native_terms
from supervisor.compose.panel import BackendPool, PanelTerm, RewardPanel
from supervisor.compose.recipe_lines import line_of, line_of_message
from supervisor.config import (
    JobBackendConfig,
    LocalBackendConfig,
    ManagedScorerProcessSpec,
    PanelConfig,
    RemoteBackendConfig,
    TermConfig,
    settings,
)
from supervisor.errors import ConfigError, validation_message

TARGET = "_target_"


@dataclasses.dataclass(frozen=True)
class Recipe:
    """A training panel and, optionally, a validation panel (which shares its backends)."""

    train: PanelConfig
    validation: PanelConfig | None = None
    style: str = "panel"


def _mapping(text: str, path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:  # its str() spans lines: the mark and the problem make one
        mark = getattr(exc, "problem_mark", None)
        problem = " ".join(str(getattr(exc, "problem", None) or exc).split())
        raise ConfigError(
            f"{_at(path, mark.line + 1 if mark else None)}: not YAML: {problem}"
        ) from exc
    if not isinstance(data, dict):
        raise ConfigError(f"recipe {path} must be a mapping at the top level")
    return data


def _at(path: Path, line: int | None) -> str:
    return f"{path}:{line}" if line is not None else str(path)


def instantiate(node: Any) -> Any:
    """Hydra's `_target_` convention, depth first (what `hydra.utils.instantiate` builds too), for
    config classes only (pydantic models): parsing a recipe never runs anything else."""
    if isinstance(node, Mapping):
        values = {key: instantiate(value) for key, value in node.items() if key != TARGET}
        if TARGET not in node:
            return values
        target = import_dotted(str(node[TARGET]), f"_target_ {node[TARGET]!r}", ConfigError)
        if not (isinstance(target, type) and issubclass(target, BaseModel)):
            raise ConfigError(
                f"_target_ {node[TARGET]!r} is not a config class; a recipe builds "
                f"supervisor.PanelConfig, "
                "TermConfig, ManagedScorerProcessSpec, ... (build backends from them with "
                "build_panels)"
            )
        try:
            return target(**values)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{node[TARGET]}: {exc}") from exc
    if isinstance(node, list):
        return [instantiate(value) for value in node]
    return node


def load_recipe(source: str | os.PathLike[str] | Mapping[str, Any]) -> Recipe:
    """Parse a recipe of any supported style into panel configs; starts nothing. What the parsers
    or the config models refuse is a ConfigError of one line, never a pydantic traceback; from a
    file, it starts with `file:line` (recipe_lines finds the line in the YAML's own marks)."""
    if isinstance(source, Mapping):
        try:
            return _parse(dict(source))
        except ValidationError as exc:
            raise ConfigError(f"the recipe: {validation_message(exc)}") from exc
    path = Path(source)
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read recipe {path}: {exc}") from exc
    try:
        return _parse(_mapping(text, path))
    except ValidationError as exc:
        line = line_of(text, exc.errors()[0].get("loc", ()))
        raise ConfigError(f"{_at(path, line)}: {validation_message(exc)}") from exc
    except ConfigError as exc:
        if str(exc).startswith((str(path), f"recipe {path} ")):
            raise
        raise ConfigError(f"{_at(path, line_of_message(text, str(exc)))}: {exc}") from exc


def _parse(data: dict[str, Any]) -> Recipe:
    reward = data.get("reward")
    if reward is not None and not isinstance(reward, (Mapping, str)):
        raise ConfigError(f"recipe `reward:` must be a mapping, got {type(reward).__name__}")
    if TARGET in data or (isinstance(reward, Mapping) and TARGET in reward):
        return _from_targets(data)
    if isinstance(reward, Mapping) and ("models" in reward or "reward_functions" in reward):
        return _from_verl_omni(reward)
    if "catalog" in data:
        return _from_catalog(data)
    if "rewards" in data:
        return Recipe(*ff_panels(data), style="ff")
    if "terms" in data:
        return Recipe(PanelConfig.model_validate(data))
    raise ConfigError(
        "unrecognised recipe: expected a `_target_` tree, `reward.models` + "
        "`reward.reward_functions`, a `catalog:` with `reward:`, an FF `rewards:` list, or a "
        "`terms:` list"
    )


def _as_panel(value: Any, where: str) -> PanelConfig | None:
    if value is None or isinstance(value, PanelConfig):
        return value
    raise ConfigError(
        f"{where}: the `_target_` tree must build a supervisor.PanelConfig, got "
        f"{type(value).__name__}"
    )


def _from_targets(data: Mapping[str, Any]) -> Recipe:
    if TARGET in data:
        return Recipe(_as_panel(instantiate(data), "recipe") or _missing("recipe"), style="targets")
    train = _as_panel(instantiate(data["reward"]), "reward")
    validation = _as_panel(instantiate(data.get("validation")), "validation")
    return Recipe(train or _missing("reward"), validation, style="targets")


def _missing(where: str) -> PanelConfig:
    raise ConfigError(f"{where} is empty")


MODEL_KEYS = {
    "backend",
    "scorer",
    "params",
    "revision",
    "identity_hash",
    "catalog",
    "device",
    "input_kind",
}


# a remote model's keys are its config's own (`client` too, below; `base_urls` is base_url's other
# spelling)
REMOTE_KEYS = (set(RemoteBackendConfig.model_fields) - {"kind", "client"}) | {"base_urls"}


def _verl_model(name: str, model: Mapping[str, Any], group_size: int | None) -> dict[str, Any]:
    """A verl-omni named model -> a backend config (`backend: managed | local | remote`)."""
    kind = model.get("backend", "managed")
    scorer, client = _verl_scorer_and_client(name, model)
    if kind == "remote":
        unknown = (
            set(model) - REMOTE_KEYS - {"backend", "client", "request_batch_size", "input_kind"}
        )
        if unknown:
            raise ConfigError(
                f"reward.models.{name}: unknown keys {sorted(unknown)} for a remote model"
            )
        return {
            "kind": "remote",
            "client": client,
            **{k: model[k] for k in REMOTE_KEYS if k in model},
        }
    unknown = (
        set(model)
        - MODEL_KEYS
        - {"client", "request_batch_size", "process", "offload", "python_executable"}
    )
    unknown -= {"restart", "limits", "env", "extra_import_paths"}
    if unknown:
        raise ConfigError(f"reward.models.{name}: unknown keys {sorted(unknown)}")
    if kind == "local":
        return {"kind": "local", "scorer": scorer, "client": client}
    if kind != "managed":
        raise ConfigError(
            f"reward.models.{name}.backend must be managed, local or remote, got {kind!r}"
        )
    return _verl_managed(model, scorer, client)


def _verl_scorer_and_client(
    name: str, model: Mapping[str, Any]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """A named model's scorer config (its name defaults to the model's) and client config."""
    keys = ("params", "revision", "identity_hash", "catalog", "device", "input_kind")
    scorer = {key: model[key] for key in keys if key in model}
    scorer["name"] = model.get("scorer", name)
    client = dict(model.get("client", {}))
    if "input_kind" in scorer:  # else the scorer's own (ScorerConfig), or text for a remote one
        client.setdefault("input_kind", scorer["input_kind"])
    if "request_batch_size" in model:
        client["request_batch_size"] = model["request_batch_size"]
    return scorer, client


def _verl_managed(
    model: Mapping[str, Any], scorer: dict[str, Any], client: dict[str, Any]
) -> dict[str, Any]:
    """A named model's managed-child config: its process keys, its env (a name, or variables)."""
    process = dict(model.get("process", {}))
    for key in ("python_executable", "extra_import_paths"):
        if key in model:
            process[key] = model[key]
    named_env = model.get("env")
    if isinstance(named_env, Mapping):  # environment variables for the child
        process["env"] = named_env
    managed: dict[str, Any] = {
        "kind": "managed",
        "env": named_env if isinstance(named_env, str) else None,  # a scorer env by name
        "process": process,
        "scorer": scorer,
        "client": client,
        "gpu_residency": "per_call" if model.get("offload", False) else "resident",
    }
    for key in ("restart", "limits"):
        if key in model:
            managed[key] = model[key]
    return managed


# what this style reads of verl-omni's `reward:`; its other keys (reward_manager, reward_model, ...)
# are verl's
VERL_OMNI_KEYS = ("models", "reward_functions", "val_reward_functions", "group_size")


def _from_verl_omni(reward: Mapping[str, Any]) -> Recipe:
    for key in reward:
        near = difflib.get_close_matches(str(key), VERL_OMNI_KEYS, n=1, cutoff=0.8)
        # a misspelt key of ours would be ignored: said instead
        if key not in VERL_OMNI_KEYS and near:
            raise ConfigError(
                f"reward.{key}: not a key this recipe reads (did you mean {near[0]!r}?)"
            )
    models = reward.get("models") or {}
    if not isinstance(models, Mapping):
        raise ConfigError("reward.models must be a mapping of named models")
    common = _common_reward_model(reward, models)
    models = with_defaults(models, common)
    check_pool(models, common)
    group_size = reward.get("group_size")
    backends = {
        name: _verl_model(name, model, group_size)
        for name, model in models.items()
        if not is_native(model) and not is_engine(model)
    }
    native = {name: model for name, model in models.items() if is_native(model)}
    named = _VerlModels(models, backends, native, engine_backends(models), group_size)
    train = named.panel(reward.get("reward_functions"), "reward.reward_functions")
    if train is None:
        raise ConfigError("reward.reward_functions is empty")
    return Recipe(
        train,
        named.panel(reward.get("val_reward_functions"), "reward.val_reward_functions"),
        style="verl-omni",
    )


def _common_reward_model(reward: Mapping[str, Any], models: Mapping[str, Any]) -> Mapping[str, Any]:
    """`reward.reward_model`: the engine models' common defaults (`model_path`, `rollout`); its
    single global model (`enable: true`) cannot stand beside named models (verl-omni's rule)."""
    common = reward.get("reward_model") or {}
    if not isinstance(common, Mapping):
        raise ConfigError("reward.reward_model must be a mapping")
    if common.get("enable") and models:
        raise ConfigError(
            "reward.reward_model.enable: true with reward.models: the single global reward model "
            "and named models cannot run together; set reward.reward_model.enable: false"
        )
    return common


@dataclasses.dataclass(frozen=True)
class _VerlModels:
    """A verl-omni recipe's named models, as its reward functions bind them."""

    models: Mapping[str, Any]
    backends: Mapping[str, dict[str, Any]]  # managed, local or remote models: their backend configs
    native: Mapping[str, Any]  # `backend: native` models: their entries
    engines: Mapping[str, dict[str, Any]]  # `backend: engine` models: their backends, no functions
    group_size: int | None

    def panel(self, functions: Mapping[str, Any] | None, where: str) -> PanelConfig | None:
        """The panel of `functions` (`reward_functions` or `val_reward_functions`); None: none
        given."""
        if not functions:
            return None
        entries = [(name, fn if fn is not None else {}) for name, fn in functions.items()]
        for name, fn in entries:
            if not isinstance(fn, Mapping):
                raise ConfigError(
                    f"{where}.{name} must be a mapping (model, weight, required, ...)"
                )
        bound_native = [(n, fn) for n, fn in entries if fn.get("model", n) in self.native]
        on_native = native_terms(self.models, bound_native, where)
        bound_engine = [(n, fn) for n, fn in entries if fn.get("model", n) in self.engines]
        on_native.update(engine_terms(self.engines, bound_engine, where))
        terms = [
            on_native[name] if name in on_native else self._term(name, fn, where)
            for name, fn in entries
        ]
        return PanelConfig.model_validate({"terms": terms, "group_size": self.group_size})

    def _term(self, name: str, fn: Mapping[str, Any], where: str) -> dict[str, Any]:
        if "path" in fn or "name" in fn:
            raise ConfigError(
                f"{where}.{name}: `path`/`name` (a Python scoring function) is verl-omni's; "
                f"here a reward "
                "function binds a model's scorer term (`model:`, `component:`). Put Python "
                "scorers in a catalog or pass their dotted path as the model's `scorer:`"
            )
        # a term uses the model of its own name unless it binds another
        bound = fn.get("model", name)
        if bound not in self.backends:
            raise ConfigError(
                f"{where}.{name}: model {bound!r} is not in reward.models ({sorted(self.models)})"
            )
        term = {k: v for k, v in fn.items() if k != "model"}
        return {"name": name, "backend": self.backends[bound], **term}


def _from_catalog(data: Mapping[str, Any]) -> Recipe:
    catalog = data["catalog"]
    execution = data.get("execution", {"kind": "local"})

    def panel(selection: Any, where: str) -> PanelConfig | None:
        if selection is None:
            return None
        if isinstance(selection, str):
            selection = {"provider": selection}
        provider = selection.get("provider")
        if not provider:
            raise ConfigError(f"{where}.provider names the catalog entry to use")
        _check_selection_keys(selection, where)
        scorer = {"name": provider, "catalog": catalog}
        for key in ("params", "revision", "identity_hash", "input_kind"):
            if key in selection:
                scorer[key] = selection[key]
        kind = execution.get("kind", "local")
        # else the scorer's own
        client = {"input_kind": scorer["input_kind"]} if "input_kind" in scorer else {}
        backend: dict[str, Any] = {"kind": kind, "scorer": scorer, "client": client}
        if kind == "managed":
            backend["process"] = {k: v for k, v in execution.items() if k != "kind"}
            # a scorer env by name, not variables
            if isinstance(backend["process"].get("env"), str):
                backend["env"] = backend["process"].pop("env")
        elif kind != "local":
            raise ConfigError(f"execution.kind must be local or managed, got {kind!r}")
        weights = selection.get("weights") or {}
        terms = selection.get("terms") or list(weights) or [None]
        return PanelConfig.model_validate(
            {
                # validation's own (Posttrain: held-out validation has its own n_generation)
                "group_size": selection.get("group_size", data.get("group_size")),
                "terms": [
                    {
                        "name": term or provider,
                        "backend": backend,
                        "component": term,
                        "weight": weights.get(term, 1.0) if term else 1.0,
                    }
                    for term in terms
                ],
            }
        )

    train = panel(data.get("reward"), "reward")
    if train is None:
        raise ConfigError("reward: selects the training provider from the catalog")
    return Recipe(train, panel(data.get("validation"), "validation"), style="catalog")


SELECTION_KEYS = (
    "provider",
    "params",
    "revision",
    "identity_hash",
    "input_kind",
    "weights",
    "terms",
    "group_size",
)


def _check_selection_keys(selection: Mapping[str, Any], where: str) -> None:
    """A key the selection does not know is refused, never dropped (a `group_size` that silently
    did nothing would let every group size through)."""
    unknown = sorted(set(selection) - set(SELECTION_KEYS))
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {unknown}; a selection takes {SELECTION_KEYS}")


def make_backend(
    config: ManagedScorerProcessSpec | LocalBackendConfig | RemoteBackendConfig | JobBackendConfig,
    start: bool = True,
) -> RewardBackend:
    """One backend from its config, each kind by its own `from_config` (every setting by its name,
    none copied here); a managed child starts here unless `start=False` (then `start()` starts it:
    panels start their children together)."""
    from supervisor.backends.jobs import JobRewardBackend
    from supervisor.backends.local import LocalRewardBackend
    from supervisor.backends.managed import ManagedScorerProcessBackend
    from supervisor.backends.remote import RemoteRewardBackend
    from supervisor.compose.remote_servers import MultiRemoteRewardBackend
    from supervisor.compose.replicas import ReplicatedBackend

    if isinstance(config, ManagedScorerProcessSpec):
        # one listed device: narrowed to it too
        if config.replicas.size > 1 or config.replicas.devices:
            return ReplicatedBackend(config, start=start)
        return ManagedScorerProcessBackend(config, start=start)
    if isinstance(config, LocalBackendConfig):
        return LocalRewardBackend.from_config(config)
    if isinstance(config, JobBackendConfig):
        return JobRewardBackend.from_config(config, _token(config))
    if len(config.urls) > 1:
        return MultiRemoteRewardBackend.from_config(config, _token(config))
    return RemoteRewardBackend.from_config(config, _token(config))


def _token(config: RemoteBackendConfig | JobBackendConfig) -> str | None:
    """The bearer token from the variable the config names (its name is configuration, its value
    never)."""
    if config.token_env is None:
        return None
    token = os.environ.get(config.token_env)
    if not token:
        raise ConfigError(
            f"{config.kind} backend {config.base_url}: environment variable "
            f"{config.token_env} is not set"
        )
    return token


def build_panel(config: PanelConfig, pool: BackendPool | None = None) -> RewardPanel:
    """A panel whose backends come from `pool` (a private one by default): terms with the same
    backend configuration share one backend, whatever their weights and request batch sizes
    (`batch_view`)."""
    pool = pool if pool is not None else BackendPool()
    configs = [term.backend.model_dump(mode="json") for term in config.terms]
    acquired = pool.acquire_all(
        [
            (
                shared_key(dumped),
                lambda t=term: make_backend(t.backend, start=False),  # type: ignore[misc]
            )
            for term, dumped in zip(config.terms, configs, strict=True)
        ]
    )
    try:
        terms = [
            _panel_term(term, term_backend(backend, dumped))
            for term, backend, dumped in zip(config.terms, acquired, configs, strict=True)
        ]
        return RewardPanel(
            terms, release=lambda: _release_all(pool, acquired), **settings(config, leave={"terms"})
        )
    except BaseException:
        _release_all(pool, list(acquired))
        raise


def _panel_term(term: TermConfig, backend: RewardBackend) -> PanelTerm:
    """The term its config describes, every field by its name, over the backend built from its
    config."""
    return PanelTerm(backend=backend, **settings(term, leave={"backend"}))


def _release_all(pool: BackendPool, backends: list[RewardBackend]) -> None:
    errors = []
    while backends:
        try:
            pool.release(backends.pop())
        except Exception as exc:  # noqa: BLE001 - every backend is released; the first error is raised
            errors.append(exc)
    if errors:
        raise errors[0]


def build_panels(
    recipe: Recipe, pool: BackendPool | None = None
) -> tuple[RewardPanel, RewardPanel | None]:
    """The training panel and the validation panel (or None), sharing backends through `pool`."""
    pool = pool if pool is not None else BackendPool()
    train = build_panel(recipe.train, pool)
    try:
        validation = build_panel(recipe.validation, pool) if recipe.validation is not None else None
    except BaseException:
        train.close()
        raise
    return train, validation


def with_chunks_timed(recipe: Recipe) -> Recipe:
    """`recipe` with every chunked backend timing its chunks (`ClientConfig.time_chunks`): what
    the `score` CLI runs, so its tail lines cover every term, those whose scorer times nothing."""
    validation = recipe.validation
    return dataclasses.replace(
        recipe,
        train=_panel_timed(recipe.train),
        validation=None if validation is None else _panel_timed(validation),
    )


def _panel_timed(panel: PanelConfig) -> PanelConfig:
    terms = []
    for term in panel.terms:
        client = getattr(term.backend, "client", None)  # a job service cuts no chunks
        if client is not None:
            timed = client.model_copy(update={"time_chunks": True})
            term = term.model_copy(
                update={"backend": term.backend.model_copy(update={"client": timed})}
            )
        terms.append(term)
    return panel.model_copy(update={"terms": terms})
