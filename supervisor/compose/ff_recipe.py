"""FF's `rewards:` list (and `eval_rewards:`) as panel configs.

Each entry is one term: `name`, `reward_model` (an FF-style model class by dotted path, run by
`scorers.ff.scorer:FfModelScorer`, or a name of this project's registry), `weight` (a number or
`{data_source: weight}`, "*" for the rest), `applicable_datasets`, and the model's own keys
(`model_path`, `dtype`, `batch_size`, `async_reward`, `num_workers`); any other key goes to the
model's `config.extra_kwargs`, as FF does. A model class may also be named by the short name a
module registered (`scorers.ff.register_reward_model`), and its `config.name` is the entry's name.
Entries of one model identity, in `rewards:` and `eval_rewards:` alike, share one child whatever
their batch sizes, as FF's loader shares one instance. Ours: `env` (the scorer env of its managed
child), `backend: local` (in the trainer's process instead), `required`, `input_kind`,
`python_executable`, `extra_import_paths`. A model class must say where it runs (`env`,
`python_executable` or `backend: local`): its env is not known here, where it cannot be imported.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from scorers.ff.registry import reward_model_path
from scorers.identity import canonical_json
from supervisor.config import PanelConfig
from supervisor.errors import ConfigError

TERM_KEYS = {"name", "weight", "applicable_datasets", "required"}
PLACE_KEYS = {"env", "backend", "python_executable", "extra_import_paths", "input_kind", "device"}
MODEL_KEYS = {"model_path", "dtype", "batch_size", "async_reward", "num_workers"}
MODEL_ONLY = MODEL_KEYS - {"batch_size"}
FF_SCORER = "scorers.ff.scorer:FfModelScorer"  # by path: the child imports it like any scorer
DEFAULT_BATCH = 16  # FF's


def ff_panels(data: Mapping[str, Any]) -> tuple[PanelConfig, PanelConfig | None]:
    """The training panel (`rewards:`) and the validation panel (`eval_rewards:`, or None)."""
    train = _terms(data.get("rewards"), "rewards")
    if not train:
        raise ConfigError("rewards: is empty")
    validation = _terms(data.get("eval_rewards"), "eval_rewards")
    _share_models([*train, *validation])
    group_size = data.get("group_size")
    return PanelConfig.model_validate({"terms": train, "group_size": group_size}), (
        PanelConfig.model_validate({"terms": validation, "group_size": group_size})
        if validation
        else None
    )


def _terms(entries: Any, where: str) -> list[dict[str, Any]]:
    if entries is None:
        return []
    if isinstance(entries, Mapping):  # FF's one-reward shorthand
        entries = [entries]
    if not isinstance(entries, list):
        raise ConfigError(f"{where} must be a list of rewards, got {type(entries).__name__}")
    return [_term(entry, f"{where}[{index}]") for index, entry in enumerate(entries)]


def _share_models(terms: list[dict[str, Any]]) -> None:
    """FF's dedup: entries of one model identity (class, `model_path`, dtype, device, workers, the
    model's own keys, where it runs; not name, weight or batch size) load it once. Each takes the
    first one's `name` (FF builds the shared model from the first config) and the largest
    `batch_size` as the child's chunk; its own batch size cuts its calls (`batch_view`)."""
    shared: dict[str, list[dict[str, Any]]] = {}
    for term in terms:
        params = term["backend"]["scorer"]["params"]
        if term["backend"]["scorer"]["name"] != FF_SCORER:
            continue
        same = {k: v for k, v in params.items() if k not in ("name", "batch_size")}
        scorer = {**term["backend"]["scorer"], "params": same}
        key = canonical_json({**term["backend"], "scorer": scorer, "client": None}).decode()
        shared.setdefault(key, []).append(params)
    for group in (group for group in shared.values() if len(group) > 1):
        chunk = max(params.get("batch_size", DEFAULT_BATCH) for params in group)
        for params in group:
            params.update(name=group[0]["name"], batch_size=chunk)


def _term(entry: Any, where: str) -> dict[str, Any]:
    if not isinstance(entry, Mapping) or not isinstance(entry.get("name"), str):
        raise ConfigError(f"{where}: a reward is a mapping with a `name` and a `reward_model`")
    model = entry.get("reward_model")
    if not isinstance(model, str) or not model:
        raise ConfigError(
            f"{where} ({entry['name']}): `reward_model` names a model class or a registered scorer"
        )
    where = f"{where} ({entry['name']})"
    extra = {
        k: v
        for k, v in entry.items()
        if k not in TERM_KEYS | PLACE_KEYS | MODEL_KEYS | {"reward_model"}
    }
    registered = reward_model_path(model) if ":" not in model and "." not in model else None
    is_class = ":" in model or "." in model or registered is not None
    if is_class:
        params = _model_params(registered or model, entry, extra)
        scorer = {"name": FF_SCORER, "params": {**params, "name": entry["name"]}}
        request_batch_size = entry.get("batch_size", DEFAULT_BATCH)
    else:
        given = sorted(MODEL_ONLY & set(entry))
        if given:
            raise ConfigError(
                f"{where}: {given} configure a model class; {model!r} is a registered scorer"
            )
        scorer = {"name": model, "params": extra}
        request_batch_size = entry.get("batch_size", 64)
    scorer.update(input_kind=entry.get("input_kind", "image"), device=entry.get("device", "cpu"))
    client = {"input_kind": scorer["input_kind"], "request_batch_size": request_batch_size}
    term = {k: entry[k] for k in TERM_KEYS if k in entry}
    return {**term, "backend": _backend(entry, scorer, client, where, is_class)}


def _model_params(model: str, entry: Mapping[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    params = {key: entry[key] for key in MODEL_KEYS if key in entry}
    return {"model": model, **params, **({"params": extra} if extra else {})}


def _backend(
    entry: Mapping[str, Any],
    scorer: dict[str, Any],
    client: dict[str, Any],
    where: str,
    is_class: bool,
) -> dict[str, Any]:
    kind = entry.get("backend", "managed")
    if kind == "local":
        return {"kind": "local", "scorer": scorer, "client": client}
    if kind != "managed":
        raise ConfigError(
            f"{where}: backend must be managed (the default: its own child) or local, got {kind!r}"
        )
    process = {k: entry[k] for k in ("python_executable", "extra_import_paths") if k in entry}
    env = entry.get("env")
    if is_class and env is None and "python_executable" not in process:
        raise ConfigError(
            f"{where}: say where the model runs: `env: NAME` (a managed child in that scorer env), "
            "`python_executable:`, or `backend: local` (the trainer's own process)"
        )
    if env is not None and not isinstance(env, str):
        raise ConfigError(f"{where}: env names a scorer env, got {env!r}")
    return {"kind": "managed", "env": env, "process": process, "scorer": scorer, "client": client}
