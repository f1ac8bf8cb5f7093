"""FF's `rewards:` list (and `eval_rewards:`) as panel configs.

Each entry is one term: `name`, `reward_model` (an FF-style model class by dotted path, run by
`scorers.ff.scorer:FfModelScorer`, or a name of this project's registry), `weight` (a number or
`{data_source: weight}`, "*" for the rest), `applicable_datasets`, and the model's own keys
(`model_path`, `dtype`, `batch_size`, `async_reward`, `num_workers`); any other key goes to the
model's `config.extra_kwargs`, as FF does. Ours: `env` (the scorer env of its managed child),
`backend: local` (in the trainer's process instead), `required`, `input_kind`,
`python_executable`, `extra_import_paths`. A model class must say where it runs (`env`,
`python_executable` or `backend: local`): its env is not known here, where it cannot be imported.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from supervisor.config import PanelConfig
from supervisor.errors import ConfigError

TERM_KEYS = {"name", "weight", "applicable_datasets", "required"}
PLACE_KEYS = {"env", "backend", "python_executable", "extra_import_paths", "input_kind", "device"}
MODEL_KEYS = {"model_path", "dtype", "batch_size", "async_reward", "num_workers"}
MODEL_ONLY = MODEL_KEYS - {"batch_size"}
FF_SCORER = "scorers.ff.scorer:FfModelScorer"  # by path: the child imports it like any scorer


def ff_panels(data: Mapping[str, Any]) -> tuple[PanelConfig, PanelConfig | None]:
    """The training panel (`rewards:`) and the validation panel (`eval_rewards:`, or None)."""
    train = _panel(data.get("rewards"), "rewards", data.get("group_size"))
    if train is None:
        raise ConfigError("rewards: is empty")
    return train, _panel(data.get("eval_rewards"), "eval_rewards", data.get("group_size"))


def _panel(entries: Any, where: str, group_size: Any) -> PanelConfig | None:
    if entries is None:
        return None
    if isinstance(entries, Mapping):  # FF's one-reward shorthand
        entries = [entries]
    if not isinstance(entries, list):
        raise ConfigError(f"{where} must be a list of rewards, got {type(entries).__name__}")
    if not entries:
        return None
    terms = [_term(entry, f"{where}[{index}]") for index, entry in enumerate(entries)]
    return PanelConfig.model_validate({"terms": terms, "group_size": group_size})


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
    is_class = ":" in model or "." in model
    if is_class:
        scorer = {"name": FF_SCORER, "params": _model_params(model, entry, extra)}
        request_batch_size = entry.get("batch_size", 16)
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
