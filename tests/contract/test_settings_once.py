"""Every backend setting is stated once: a constructor's keyword is a config field of the same name,
and a config field reaches the constructor, so a setting added to a backend is settable from a
recipe (the recipe, the Python API and the CLI all build through `from_config`, which passes fields
by name)."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest
from pydantic import BaseModel

from supervisor.backends import jobs, local, remote
from supervisor.backends.jobs import JobRewardBackend
from supervisor.backends.local import LocalRewardBackend
from supervisor.backends.managed import ManagedScorerProcessBackend
from supervisor.backends.remote import RemoteRewardBackend
from supervisor.compose.panel import PanelTerm, RewardPanel
from supervisor.compose.ray_pool import RayPoolBackend, RayPoolConfig
from supervisor.compose.recipes import build_panels, load_recipe
from supervisor.compose.remote_servers import MultiRemoteRewardBackend
from supervisor.compose.replicas import ReplicatedBackend
from supervisor.config import (
    JobBackendConfig,
    LocalBackendConfig,
    ManagedScorerProcessSpec,
    PanelConfig,
    RemoteBackendConfig,
    TermConfig,
)

# Constructor parameters that cannot be configuration, and why
TOKEN = "a secret: the config names its variable (token_env), never its value"
START = (
    "when the child starts, the caller's choice (a panel starts its children together), not "
    "a setting"
)
PROBES = ("probe_timeout_s", "probe_interval_s", "hedge")


@dataclass(frozen=True)
class Case:
    """A constructor and the config model it is built from."""

    builder: Callable[..., Any]
    model: type[BaseModel]
    flatten: tuple[str, ...] = ()  # nested models whose fields are the constructor's keywords
    # config fields no constructor takes, and why
    not_settings: Mapping[str, str] = field(default_factory=dict)
    # parameters that cannot be config, and why
    runtime: Mapping[str, str] = field(default_factory=dict)
    # parameter -> its field, where the names differ
    renamed: Mapping[str, str] = field(default_factory=dict)
    options: Callable[..., Any] | None = None  # whose parameters a `**options` passes on
    whole: str | None = None  # the one parameter that takes the whole model


CASES = {
    "remote": Case(
        RemoteRewardBackend.__init__,
        RemoteBackendConfig,
        ("client",),
        remote.NOT_SETTINGS,
        {"token": TOKEN},
    ),
    "multi_remote": Case(
        MultiRemoteRewardBackend.__init__,
        RemoteBackendConfig,
        ("client",),
        {k: why for k, why in remote.NOT_SETTINGS.items() if k not in PROBES},
        {"token": TOKEN},
        # `base_url` takes one URL or a list of them; `base_urls` is its other spelling in a config
        {"base_urls": "base_url"},
        options=RemoteRewardBackend.__init__,
    ),
    "jobs": Case(
        JobRewardBackend.__init__, JobBackendConfig, (), jobs.NOT_SETTINGS, {"token": TOKEN}
    ),
    # a scorer by its name (from Python, an instance too: it has no config)
    "local": Case(
        LocalRewardBackend.__init__,
        LocalBackendConfig,
        ("scorer", "client"),
        local.NOT_SETTINGS,
        renamed={"scorer": "name"},
    ),
    "managed": Case(
        ManagedScorerProcessBackend.__init__,
        ManagedScorerProcessSpec,
        runtime={"start": START},
        whole="spec",
    ),
    "replicas": Case(
        ReplicatedBackend.__init__, ManagedScorerProcessSpec, runtime={"start": START}, whole="spec"
    ),
    "ray_pool": Case(RayPoolBackend.create, RayPoolConfig, whole="config"),
    # its backend: the one built from the term's backend config
    "panel_term": Case(PanelTerm, TermConfig),
    "panel": Case(
        RewardPanel.__init__,
        PanelConfig,
        runtime={
            "owns_backends": "whether closing the panel closes its backends: a Python caller's, "
            "a recipe's own",
            "release": "a callback (a recipe's panel returns its backends to their pool)",
        },
    ),
}


def parameters(case: Case) -> dict[str, inspect.Parameter]:
    """The constructor's named parameters; a `**options` stands for those of `case.options` it
    passes on."""
    found: dict[str, inspect.Parameter] = {}
    for name, parameter in inspect.signature(case.builder).parameters.items():
        if name in ("self", "cls"):
            continue
        if parameter.kind is inspect.Parameter.VAR_KEYWORD and case.options is not None:
            passed = parameters(Case(case.options, case.model))
            # each server's own URL
            found |= {k: p for k, p in passed.items() if k not in found and k != "base_url"}
        elif parameter.kind not in (
            inspect.Parameter.VAR_POSITIONAL,
            inspect.Parameter.VAR_KEYWORD,
        ):
            found[name] = parameter
    return found


def fields(case: Case) -> dict[str, Any]:
    """The model's fields by name (those of `case.flatten` lifted), each with its default."""
    found: dict[str, Any] = {}
    for name, info in case.model.model_fields.items():
        nested = info.annotation
        if name in case.flatten:
            assert isinstance(nested, type) and issubclass(nested, BaseModel)
            found |= {
                inner: default(inner_info) for inner, inner_info in nested.model_fields.items()
            }
        else:
            found[name] = default(info)
    return found


def default(info: Any) -> Any:
    if info.default_factory is not None:
        return info.default_factory()
    return None if info.is_required() else info.default


def empty_as_none(value: Any) -> Any:
    """None, (), [] and {} say the same: nothing given."""
    return (
        None if value is None or (isinstance(value, (tuple, list, dict)) and not value) else value
    )


@pytest.mark.parametrize("name", list(CASES))
def test_every_constructor_keyword_is_a_config_field_and_every_field_reaches_it(name):
    case = CASES[name]
    params, config = parameters(case), fields(case)
    assert set(case.runtime) <= set(params), (
        f"runtime-only names that are no parameter: {set(case.runtime) - set(params)}"
    )
    if case.whole is not None:
        assert set(params) - set(case.runtime) == {case.whole}, (
            f"{name}: settings outside the {case.model.__name__} it takes whole: put them in "
            f"the model"
        )
        return
    settings = set(params) - set(case.runtime)
    targets = {case.renamed.get(param, param) for param in settings}
    no_field = sorted(param for param in settings if case.renamed.get(param, param) not in config)
    assert no_field == [], (
        f"{name}: constructor keywords {no_field} have no field in {case.model.__name__}: "
        f"add them there "
        "(or list them here as runtime-only, with why)"
    )
    assert set(case.not_settings) <= set(config), (
        f"{name}: stale not_settings {set(case.not_settings) - set(config)}"
    )
    assert not set(case.not_settings) & targets, (
        f"{name}: fields said to be no setting that the constructor takes"
    )
    unreached = sorted(set(config) - targets - set(case.not_settings))
    assert unreached == [], (
        f"{name}: {case.model.__name__} fields {unreached} reach no constructor keyword: add "
        f"them to it "
        "(or to the backend's NOT_SETTINGS, with why)"
    )


@pytest.mark.parametrize("name", [name for name, case in CASES.items() if case.whole is None])
def test_a_constructor_default_is_its_config_fields_default(name):
    case = CASES[name]
    config = fields(case)
    differ = {
        param: (parameter.default, config[case.renamed.get(param, param)])
        for param, parameter in parameters(case).items()
        if param not in case.runtime
        and case.renamed.get(param, param) in config  # one without a field: the test above names it
        and parameter.default is not inspect.Parameter.empty
        and empty_as_none(parameter.default)
        != empty_as_none(config[case.renamed.get(param, param)])
    }
    assert differ == {}, f"{name}: (constructor default, config default) differ: {differ}"


# -- from_config passes every setting ---------------------------------------------------------
FROM_CONFIG = {
    "remote": (RemoteRewardBackend, {"kind": "remote", "base_url": "http://127.0.0.1:9"}),
    "multi_remote": (
        MultiRemoteRewardBackend,
        {"kind": "remote", "base_url": ["http://a:1", "http://b:2"]},
    ),
    "jobs": (JobRewardBackend, {"kind": "jobs", "base_url": "http://127.0.0.1:9", "fps": 8}),
    "local": (LocalRewardBackend, {"kind": "local", "scorer": {"name": "exact_match"}}),
}


@pytest.mark.parametrize("name", list(FROM_CONFIG))
def test_from_config_passes_every_setting_by_its_name(name, monkeypatch):
    """Not one setting is left to the constructor's default: each comes from the config."""
    cls, data = FROM_CONFIG[name]
    case = CASES[name]
    signature = inspect.signature(cls.__init__)
    passed: dict[str, Any] = {}

    def record(self: Any, *args: Any, **kwargs: Any) -> None:
        passed.update(signature.bind(self, *args, **kwargs).arguments)

    monkeypatch.setattr(cls, "__init__", record)
    config = case.model.model_validate(data)
    cls.from_config(config)  # type: ignore[attr-defined]
    given = set(passed) - {"self"}
    if "options" in given:
        given = (given - {"options"}) | set(passed["options"])
    missing = sorted(set(parameters(case)) - set(case.runtime) - given)
    assert missing == [], f"{name}: from_config leaves {missing} to the constructor's defaults"


# -- the remote backend's retries, from a recipe ----------------------------------------------
HEALTH = {
    "scorer": "probe",
    "terms": ["probe"],
    "concurrent_calls": 1,
    "identity_hash": "f" * 64,
    "state": "ready",
}
RETRIES = {
    "max_retries": 0,
    "retry_backoff_s": 0.5,
    "retry_backoff_cap_s": 4.0,
    "max_request_bytes": 4096,
}
RECIPES = {
    "terms": {
        "terms": [
            {
                "name": "probe",
                "backend": {"kind": "remote", "base_url": "http://127.0.0.1:9", **RETRIES},
            }
        ]
    },
    "verl-omni": {
        "reward": {
            "models": {"probe": {"backend": "remote", "base_url": "http://127.0.0.1:9", **RETRIES}},
            "reward_functions": {"probe": {}},
        }
    },
}


@pytest.mark.parametrize("style", list(RECIPES))
def test_a_recipe_sets_the_remote_backends_retries(style, monkeypatch):
    # no server: its /health
    monkeypatch.setattr(RemoteRewardBackend, "health", lambda self: dict(HEALTH))
    train, validation = build_panels(load_recipe(RECIPES[style]))
    try:
        backend = train.terms[0].backend
        assert isinstance(backend, RemoteRewardBackend) and validation is None
        assert (backend.max_retries, backend.retry_backoff_s, backend.retry_backoff_cap_s) == (
            0,
            0.5,
            4.0,
        )
        assert backend.max_request_bytes == 4096
    finally:
        train.close()


def test_a_remote_config_refuses_a_first_pause_past_its_cap():
    with pytest.raises(ValueError, match="retry_backoff_s 3.0 > retry_backoff_cap_s 2.0"):
        RemoteBackendConfig(base_url="http://127.0.0.1:9", retry_backoff_s=3.0)
