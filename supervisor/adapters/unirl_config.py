"""UniRL 0.2.0's managed-backend recipe, read into this project's own configs (supervisor.config).

A UniRL recipe hands `config=` as UniRL's own `ManagedScorerProcessSpec` (Hydra builds its nested
dataclasses: `process`, `scorer`, `client: RemoteRewardSpec`) or as a mapping with the same field
names. Both are read here field by field (duck-typed: UniRL need not be importable) into one
`ManagedScorerProcessSpec` of ours (a `RemoteRewardSpec` alone, for servers of ours: our remote
backend's config), so the child is launched, pinned and bounded the one way this
project does it. A field that has no meaning here is named in the README; one that cannot be
honoured (`transport: cuda_ipc`, a second reward for one scorer) is a ConfigError.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from supervisor.adapters.unirl_weighing import Weighing
from supervisor.compose.recipes import load_recipe
from supervisor.config import ManagedScorerProcessSpec, PanelConfig, RemoteBackendConfig
from supervisor.errors import ConfigError, validation_message

log = logging.getLogger(__name__)
TARGET = "_target_"
TOP_FIELDS = frozenset(
    {"process", "scorer", "client", "gpu_residency", "idempotency_cache_size", "transport"}
)
PROCESS_FIELDS = frozenset(
    {
        "python_executable",
        "service_root",
        "startup_timeout",
        "shutdown_timeout",
        "log_dir",
        "offline",
        "allow_multiple_visible_devices",
        "transport",
    }
)
SCORER_FIELDS = frozenset({"name", "history_kind", "params", "version"})
CLIENT_FIELDS = frozenset(  # UniRL's RemoteRewardSpec
    {
        "base_url",
        "required_rewards",
        "reward_weights",
        "batch_size",
        "timeout",
        "max_retries",
        "retry_delay",
        "request_batch_size",
        "require_identity_echo",
        "expected_scorer_version",
        "sub_metric_reduce",
        "aggregation_method",
        "image_format",
        "image_quality",
        "video_fps",
        "input_kind",
        "raise_on_failure",
        "prompt_source",
    }
)
# history_kind -> (our scorer input kind, the media UniRL's frontier generated for it)
HISTORY_KINDS = {
    "image": ("image", "image"),
    "image_edit": ("image_edit", "image"),
    "text": ("text", "text"),
}
HISTORY_KINDS["video"] = ("video", "video")
HISTORY_KINDS["audio"] = ("audio", "audio")  # an extension: UniRL's spec knows image kinds only
TRANSPORTS = ("auto", "http")  # both: the loopback data plane (shared memory for large arrays)
PROMPT_SOURCES = ("original", "generation")
WEIGHING_FIELDS = ("reward_weights", "aggregation_method", "sub_metric_reduce")
# UniRL's math grader reads its timeout (int seconds, > 0) from this variable (local/mathverify.py)
MATHVERIFY_TIMEOUT_ENV = "UNIRL_MATHVERIFY_TIMEOUT_S"
IDENTITY_HASH = re.compile(r"^[0-9a-f]{64}$")  # what serve's UniRL route echoes as scorer_version


@dataclass(frozen=True)
class UniRLOptions:
    """What UniRL's RewardBackend base holds (model_name, batch_size, timeout, prompt_source), the
    media kind UniRL hands over (`input_kind`: image, video, text or audio) and the metadata key of
    the gold."""

    model_name: str
    batch_size: int = 8
    timeout: float = 300.0
    prompt_source: str = "generation"
    input_kind: str = "image"
    reference_key: str = "reference"
    # UniRL's reward_weights, aggregation_method and sub_metric_reduce, as given (unirl_weighing)
    weighing: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.prompt_source not in PROMPT_SOURCES:
            raise ConfigError(
                f"prompt_source must be 'original' or 'generation', got {self.prompt_source!r}"
            )
        if self.input_kind not in ("image", "video", "text", "audio"):
            raise ConfigError(
                f"input_kind must be image, video, text or audio, got {self.input_kind!r}"
            )


def plain(value: Any) -> Any:
    """OmegaConf containers and tuples as dicts and lists (a dataclass is left as it is)."""
    if isinstance(value, Mapping):
        return {str(key): plain(item) for key, item in value.items()}
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
        return [plain(item) for item in value]
    return value


def fields_of(node: Any, where: str, known: frozenset[str]) -> dict[str, Any]:
    """A UniRL config node's fields, from its dataclass or a mapping; an unknown name is refused."""
    if node is None:
        return {}
    if dataclasses.is_dataclass(node) and not isinstance(node, type):
        values = {field.name: getattr(node, field.name) for field in dataclasses.fields(node)}
    elif isinstance(node, Mapping):
        values = {str(key): value for key, value in node.items() if key != TARGET}
    else:
        raise ConfigError(
            f"{where} must be a mapping or UniRL's dataclass for it, got {type(node).__name__}"
        )
    unknown = sorted(set(values) - known)
    if unknown:
        raise ConfigError(f"{where}: unknown field(s) {unknown}; UniRL's are {sorted(known)}")
    return {
        key: value if dataclasses.is_dataclass(value) else plain(value)
        for key, value in values.items()
    }


def check_transport(transport: Any) -> None:
    if transport == "cuda_ipc":
        raise ConfigError(
            "transport 'cuda_ipc' is not available here: there is no CUDA IPC data plane "
            "yet. Use 'http' or 'auto' (loopback HTTP, arrays of 64 KiB or more through a "
            "shared-memory segment)"
        )
    if transport not in TRANSPORTS:
        raise ConfigError(
            f"transport must be one of {[*TRANSPORTS, 'cuda_ipc']}, got {transport!r}"
        )


def check_raises(client: Mapping[str, Any]) -> None:
    """UniRL's `raise_on_failure: false` turns a failed call into zero rewards marked failed; here a
    bad reward always stops the step (typed), so asking for the zeros is refused, not ignored."""
    if client.get("raise_on_failure", True) is not True:
        raise ConfigError(
            "config.client.raise_on_failure must be true: a failed reward call raises its "
            "typed error here, never zero rewards"
        )


def _history_kind(scorer: Mapping[str, Any]) -> tuple[str, str]:
    kind = scorer.get("history_kind", "image")
    if kind not in HISTORY_KINDS:
        raise ConfigError(
            f"config.scorer.history_kind must be one of {sorted(HISTORY_KINDS)}, got {kind!r}"
        )
    return HISTORY_KINDS[kind]


def _check_client(client: Mapping[str, Any], name: str, media: str, version: Any) -> None:
    """UniRL's own checks for one managed scorer: it serves exactly its own reward, of its media
    kind."""
    check_raises(client)
    required = list(client.get("required_rewards") or [name])
    if required != [name]:
        raise ConfigError(
            f"config.client.required_rewards is {required}, but a managed scorer serves one "
            f"reward: [{name!r}] "
            "(as UniRL checks). Several rewards: supervisor.adapters.unirl.RewardPanel over "
            "a recipe"
        )
    given = client.get("input_kind")
    if given is not None and given != media:
        raise ConfigError(
            f"config.client.input_kind {given!r} != {media!r}, the media of the scorer's "
            f"history_kind"
        )
    expected = client.get("expected_scorer_version")
    if is_identity(expected):
        return  # the identity hash: a pin of its own, beside a version
    if expected is not None and version is not None and expected != version:
        raise ConfigError(
            f"config.client.expected_scorer_version {expected!r} != config.scorer.version "
            f"{version!r}: one pin"
        )


def _process(process: Mapping[str, Any], client: Mapping[str, Any]) -> dict[str, Any]:
    """Our ProcessConfig from UniRL's ManagedProcessConfig (and the client's per-request
    timeout)."""
    if process.get("service_root"):
        log.warning(
            "config.process.service_root %r is ignored: the child runs this project's runtime "
            "(python -m child_runtime) from python_executable, not unirl-reward-service",
            process["service_root"],
        )
    out: dict[str, Any] = {}
    # empty or absent: the env the scorer declares (supervisor.config)
    if process.get("python_executable"):
        out["python_executable"] = os.fspath(process["python_executable"])
    for key in ("startup_timeout", "shutdown_timeout", "log_dir"):
        if process.get(key) is not None:
            out[key] = process[key]
    if client.get("timeout") is not None:
        out["request_timeout"] = client["timeout"]
    out["allow_multiple_gpus"] = bool(process.get("allow_multiple_visible_devices", False))
    if process.get("offline", True):  # UniRL's default: the child never reaches the Hub
        out["env"] = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    return out


def is_identity(value: Any) -> bool:
    """An `expected_scorer_version` that is an identity hash (what serve's UniRL route echoes as
    `scorer_version`) pins the identity; any other, the revision."""
    return isinstance(value, str) and IDENTITY_HASH.match(value) is not None


def version_pins(version: Any, expected: Any) -> dict[str, Any]:
    """`scorer.version` and `client.expected_scorer_version` as our pins (revision, identity)."""
    if is_identity(expected):
        return {"revision": version, "identity_hash": expected}
    return {"revision": version if version is not None else expected}


def mathverify_timeout(name: str, params: dict[str, Any]) -> dict[str, Any]:
    """UniRL's `UNIRL_MATHVERIFY_TIMEOUT_S`, where its users set it, as math_verify's `timeout_s`
    (the recipe's own `timeout_s` wins); read as UniRL reads it: an int, > 0."""
    raw = os.environ.get(MATHVERIFY_TIMEOUT_ENV)
    if name != "math_verify" or raw is None or "timeout_s" in params:
        return params
    try:
        seconds = int(raw)
    except ValueError:
        seconds = 0
    if seconds <= 0:
        raise ConfigError(f"{MATHVERIFY_TIMEOUT_ENV}={raw!r} must be a positive integer (UniRL's)")
    return {**params, "timeout_s": seconds}


def _math_timeout(term: Any) -> Any:
    """A panel term's math_verify (a managed or local scorer) with UniRL's variable as its
    `timeout_s` (`mathverify_timeout`); any other term as it is."""
    scorer = getattr(term.backend, "scorer", None)
    if scorer is None or getattr(scorer, "name", None) != "math_verify":
        return term
    params = mathverify_timeout("math_verify", dict(scorer.params))
    if params == scorer.params:
        return term
    backend = term.backend.model_copy(
        update={"scorer": scorer.model_copy(update={"params": params})}
    )
    return term.model_copy(update={"backend": backend})


def _scorer(
    scorer: Mapping[str, Any], kind: str, base_device: str | None, client: Mapping[str, Any]
) -> dict:
    """Our ScorerConfig: UniRL's `params.device` is ours `device` (a scorer gets it in load())."""
    params = dict(scorer.get("params") or {})
    device = params.pop("device", None) or base_device or "cpu"
    return {
        "name": scorer["name"],
        "input_kind": kind,
        "params": mathverify_timeout(scorer["name"], params),
        **version_pins(scorer.get("version"), client.get("expected_scorer_version")),
        "device": device,
    }


def managed_spec(
    config: Any, base_device: str | None
) -> tuple[ManagedScorerProcessSpec, UniRLOptions]:
    """UniRL's ManagedScorerProcessSpec (or a mapping of its fields) -> ours, and the base
    options."""
    top = fields_of(config, "config", TOP_FIELDS)
    process = fields_of(top.get("process"), "config.process", PROCESS_FIELDS)
    scorer = fields_of(top.get("scorer"), "config.scorer", SCORER_FIELDS)
    client = fields_of(top.get("client"), "config.client", CLIENT_FIELDS)
    check_transport(top.get("transport", process.get("transport", "auto")))
    name = scorer.get("name")
    if not isinstance(name, str) or not name.strip():
        raise ConfigError(f"config.scorer.name must name a scorer, got {name!r}")
    kind, media = _history_kind(scorer)
    _check_client(client, name, media, scorer.get("version"))
    Weighing.of(client, [name])  # UniRL's weighing of its one reward, checked before any child
    size = top.get("idempotency_cache_size", 1024)  # the child's replay cache has its own bounds
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ConfigError(f"config.idempotency_cache_size must be a positive int, got {size!r}")
    ours: dict[str, Any] = {
        "process": _process(process, client),
        "scorer": _scorer(scorer, kind, base_device, client),
        "client": {"input_kind": kind},
        "gpu_residency": top.get("gpu_residency", "resident"),
    }
    # None (UniRL's default): our default chunk size
    if client.get("request_batch_size") is not None:
        ours["client"]["request_batch_size"] = client["request_batch_size"]
    try:
        spec = ManagedScorerProcessSpec.model_validate(ours)
    except ValidationError as exc:
        raise ConfigError(f"UniRL managed scorer {name!r}: {validation_message(exc)}") from exc
    return spec, _options(client, name, media)


def _options(client: Mapping[str, Any], name: str, media: str, **overrides: Any) -> UniRLOptions:
    values = {
        "model_name": name,
        "batch_size": client.get("batch_size") or 8,
        "timeout": client.get("timeout") or 300.0,
        "prompt_source": client.get("prompt_source") or "generation",
        "input_kind": client.get("input_kind") or media,
        "weighing": {key: client[key] for key in WEIGHING_FIELDS if client.get(key) is not None},
    }
    return UniRLOptions(**{**values, **{k: v for k, v in overrides.items() if v is not None}})


def panel_config(
    recipe: Any, config: Any, model_name: str | None
) -> tuple[PanelConfig, UniRLOptions]:
    """The recipe's training panel, narrowed to `client.required_rewards` (term names) when given,
    and the base options. The weights are the recipe's (sum of weight x term, not normalised):
    UniRL's `reward_weights` and another `aggregation_method` are refused rather than
    half-honoured."""
    client = fields_of(config, "config", CLIENT_FIELDS)
    check_raises(client)
    if client.get("reward_weights"):
        raise ConfigError(
            "reward_weights: a panel's weights are its recipe's terms' `weight` (sum of "
            "weight x term)"
        )
    if client.get("aggregation_method", "weighted_sum") != "weighted_sum":
        raise ConfigError(
            f"aggregation_method {client['aggregation_method']!r}: a panel sums weight x term"
        )
    if client.get("request_batch_size") is not None:
        raise ConfigError(
            "request_batch_size: set it per backend in the recipe (client.request_batch_size)"
        )
    if isinstance(recipe, PanelConfig):
        panel = recipe
    else:
        panel = load_recipe(plain(recipe) if isinstance(recipe, Mapping) else recipe).train
    wanted = list(client.get("required_rewards") or [])
    names = [term.name for term in panel.terms]
    missing = [name for name in wanted if name not in names]
    if missing:
        raise ConfigError(
            f"config.client.required_rewards {missing} are not terms of the panel (terms: {names})"
        )
    if wanted:
        panel = panel.model_copy(
            update={"terms": [term for term in panel.terms if term.name in wanted]}
        )
    panel = panel.model_copy(update={"terms": [_math_timeout(term) for term in panel.terms]})
    return panel, _options(client, model_name or "reward_panel", "image", model_name=model_name)


def remote_config(
    config: Any, token_env: str | None
) -> tuple[RemoteBackendConfig, UniRLOptions, list[str]]:
    """UniRL's RemoteRewardSpec (or its fields), pointed at servers of ours (`serve --recipe` or
    `serve --scorer`; one URL or a list of servers of one identity), as our remote backend's config,
    the base options, and the rewards UniRL asks for (`required_rewards`; empty: the scorer's own
    reward). Every term is asked of the server: the rewards, their sub-metrics, weights and
    aggregation are UniRL's client's, computed here (adapters/unirl_weighing)."""
    client = fields_of(config, "config", CLIENT_FIELDS)
    check_raises(client)
    urls = client.get("base_url")
    listed = [urls] if isinstance(urls, str) else list(urls or [])
    if not listed or not all(
        isinstance(url, str) and url.startswith(("http://", "https://")) for url in listed
    ):
        raise ConfigError(
            f"config.base_url must be the http(s) URL of a managed-scorers server (or a list "
            f"of them), got {urls!r} "
            "(managed://: supervisor.adapters.unirl.ManagedScorerProcessBackend)"
        )
    wanted = [str(name) for name in client.get("required_rewards") or []]
    Weighing.of(client, wanted)  # none wanted: the scorer's own reward, weighing 1.0
    remote: dict[str, Any] = {
        "base_url": listed[0] if len(listed) == 1 else listed,
        "token_env": token_env,
    }
    remote["client"] = {}  # every term: UniRL's rewards are made of them here (unirl_weighing)
    if client.get("request_batch_size") is not None:
        remote["client"]["request_batch_size"] = client["request_batch_size"]
    if client.get("timeout") is not None:
        remote["request_timeout"] = client["timeout"]
    if client.get("expected_scorer_version") is not None:
        remote.update(version_pins(None, client["expected_scorer_version"]))
    try:
        parsed = RemoteBackendConfig.model_validate(remote)
    except ValidationError as exc:
        raise ConfigError(f"UniRL remote reward at {urls!r}: {validation_message(exc)}") from exc
    return parsed, _options(client, "reward_service", "image"), wanted
