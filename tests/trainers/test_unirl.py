"""UniRL 0.2.0 drop-in: `supervisor.adapters.unirl.ManagedScorerProcessBackend` and `RewardPanel`.

UniRL's own code (RewardService.score_and_attach on real Samples, Hydra's instantiate of the seed's
managed-backend recipe with only the top `_target_` changed, RewardStack with overlap) runs in
envs/trl, where the published UniRL, hydra-core and antlr 4.9.3 are installed:
tests/helpers/unirl_trainer.py, one process booting each child once. Here (the suite's venv, no
UniRL): the module imports without it, and bad configs are refused with typed errors before any
child starts.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest

from supervisor import LocalRewardBackend, RewardItem, RewardRequest
from supervisor.adapters import unirl
from supervisor.adapters.unirl_config import managed_spec, panel_config, remote_config
from supervisor.adapters.unirl_io import contributions, reward_request
from supervisor.adapters.unirl_weighing import Weighing, check_served, weigh
from supervisor.compose.panel import PanelTerm, RewardPanel
from supervisor.errors import ConfigError, ScorerRequestError
from supervisor.shape import ScorerShape
from supervisor.types import RewardResponse
from tests.conftest import REPO_ROOT, env_python, launcher_free_env, wait_until_gone

CHECKS = [
    "is a UniRL RewardBackend",
    "model name",
    "mean_intensity by hand",
    "stack rewards in row order",
    "stack components aligned",
    "stack scored on its thread",
    "dispose ends the child",
    "edit_fidelity by hand",
    "no source refused",
    "math_verify graded (antlr 4.13.2 in its child)",
    "math components",
    "the trainer keeps its own antlr",
    "video does not cover the prompt",
    "RewardService refuses it",
    "video by hand",
    "audio loudness by hand",
    "panel components",
    "panel rewards",
    "remote ['brightness', 'kept'] is a UniRL RewardBackend",
    "served panel components",
    "remote ['kept'] is a UniRL RewardBackend",
    "served panel rewards",
    "served subset rewards",
]


@pytest.fixture(scope="module")
def driven(tmp_path_factory):
    """The driver's report: every check it passed and the pid of every child it started."""
    workdir = tmp_path_factory.mktemp("unirl")
    (workdir / "service_root").mkdir()  # UniRL's spec insists the directory exists; we ignore it
    args = {
        "image_python": str(env_python("image")),
        "math_python": str(env_python("math")),
        "serve_python": sys.executable,  # a panel server runs the child runtime: this venv has it
        "recipe": str(REPO_ROOT / "tests" / "trainers" / "fixtures" / "unirl_managed_backend.yaml"),
        "service_root": str(workdir / "service_root"),
        "workdir": str(workdir),
    }
    done = subprocess.run(
        [str(env_python("trl")), "-m", "tests.helpers.unirl_trainer", json.dumps(args)],
        cwd=REPO_ROOT,  # this checkout's packages, whatever the env has installed
        env=launcher_free_env(),
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.splitlines()[-1]), done.stderr


@pytest.mark.slow
def test_unirls_own_service_recipes_and_stack_score_through_the_drop_in_as_computed_by_hand(driven):
    report, stderr = driven
    assert report["passed"] == CHECKS
    assert "service_root" in stderr and "is ignored" in stderr  # said, not silently dropped


@pytest.mark.slow
def test_no_scorer_process_is_left_after_the_unirl_trainer_exits(driven):
    report, _ = driven
    # mean_intensity, edit_fidelity, math_verify, video, audio, the panel's two; the panel server
    # and its two
    assert len(report["pids"]) >= 10
    assert wait_until_gone(report["pids"], 10) == []


def test_the_module_imports_without_unirl_and_its_classes_are_plain_then():
    assert importlib.util.find_spec("unirl") is None  # the suite's venv has no UniRL
    assert unirl.unirl_base() is None and "unirl" not in sys.modules
    backend_class = unirl.ManagedScorerProcessBackend
    assert (
        backend_class.__module__ == "supervisor.adapters.unirl"
        and backend_class is unirl.ManagedScorerProcessBackend
    )
    assert [c.__name__ for c in backend_class.__mro__] == [
        "ManagedScorerProcessBackend",
        "_ManagedBackend",
        "_UniRLFace",
        "object",
    ]
    with pytest.raises(AttributeError):
        unirl.NoSuchThing  # noqa: B018 - the module's __getattr__ knows only its three classes


def _config(**top):
    base = {"process": {"python_executable": sys.executable}, "scorer": {"name": "mean_intensity"}}
    return {**base, **top}


@pytest.mark.parametrize(
    ("config", "match"),
    [
        (_config(transport="cuda_ipc"), "no CUDA IPC data plane yet"),
        (
            _config(process={"python_executable": sys.executable, "transport": "cuda_ipc"}),
            "cuda_ipc",
        ),
        (_config(transport="grpc"), "transport must be one of"),
        (
            _config(client={"required_rewards": ["mean_intensity", "clip"]}),
            r"serves one reward: \['mean_intensity'\]",
        ),
        (_config(client={"required_rewards": ["editreward"]}), "as UniRL checks"),
        (_config(client={"input_kind": "video"}), "input_kind 'video' != 'image'"),
        (
            _config(scorer={"name": "mean_intensity", "history_kind": "speech"}),
            "history_kind must be one of",
        ),
        (
            _config(
                scorer={"name": "mean_intensity", "version": "1"},
                client={"expected_scorer_version": "2"},
            ),
            "one pin",
        ),
        (_config(gpu_residency="sometimes"), "gpu_residency"),
        (_config(client={"raise_on_failure": False}), "never zero rewards"),
        (_config(idempotency_cache_size=0), "positive int"),
        (_config(process={"python_executable": "/nonexistent/python"}), "not an executable file"),
        (
            _config(scorer={"name": "mean_intensity", "sampler": "x"}),
            r"unknown field\(s\) \['sampler'\]",
        ),
        ("editreward", "must be a mapping or UniRL's dataclass"),
    ],
)
def test_a_config_unirl_would_refuse_or_we_cannot_honour_is_a_config_error_before_any_child(
    config, match
):
    with pytest.raises(ConfigError, match=match):
        unirl.ManagedScorerProcessBackend(config=config)


def test_unirl_fields_map_onto_the_one_managed_config_and_service_root_is_ignored_aloud(caplog):
    config = _config(
        process={
            "python_executable": sys.executable,
            "service_root": "/workspace/UniRL/unirl-reward-service",
            "startup_timeout": 30,
            "shutdown_timeout": 5,
            "allow_multiple_visible_devices": True,
        },
        scorer={"name": "mean_intensity", "params": {"device": "cuda"}, "version": "1"},
        client={
            "required_rewards": ["mean_intensity"],
            "timeout": 12.5,
            "request_batch_size": 4,
            "batch_size": 3,
        },
        gpu_residency="per_call",
        transport="auto",
    )
    with caplog.at_level(logging.WARNING):
        spec, options = managed_spec(config, "cpu")
    assert "service_root" in caplog.text and "ignored" in caplog.text
    assert (
        spec.process.startup_timeout,
        spec.process.shutdown_timeout,
        spec.process.request_timeout,
    ) == (30, 5, 12.5)
    # UniRL's offline default
    assert spec.process.allow_multiple_gpus and spec.process.env["HF_HUB_OFFLINE"] == "1"
    # a pin
    assert (spec.scorer.device, spec.scorer.params, spec.scorer.revision) == ("cuda", {}, "1")
    assert (spec.client.request_batch_size, spec.gpu_residency) == (4, "per_call")
    assert (options.model_name, options.batch_size, options.timeout, options.input_kind) == (
        "mean_intensity",
        3,
        12.5,
        "image",
    )
    edit, edit_options = managed_spec(
        _config(scorer={"name": "edit_fidelity", "history_kind": "image_edit"}), None
    )
    assert (edit.scorer.input_kind, edit_options.input_kind, edit.scorer.device) == (
        "image_edit",
        "image",
        "cpu",
    )


def test_a_panel_config_picks_terms_by_required_rewards_and_refuses_unirls_own_weighting():
    recipe = {
        "terms": [
            {"name": "a", "backend": {"kind": "local", "scorer": {"name": "nonempty"}}},
            {
                "name": "b",
                "backend": {"kind": "local", "scorer": {"name": "nonempty"}},
                "weight": 2.0,
            },
        ]
    }
    panel, options = panel_config(recipe, {"required_rewards": ["b"], "input_kind": "text"}, None)
    assert [t.name for t in panel.terms] == ["b"] and (options.model_name, options.input_kind) == (
        "reward_panel",
        "text",
    )
    for config, match in [
        ({"required_rewards": ["c"]}, r"\['c'\] are not terms of the panel"),
        ({"reward_weights": {"a": 1.0}}, "a panel's weights are its recipe's"),
        ({"aggregation_method": "mean"}, "a panel sums weight x term"),
        ({"request_batch_size": 8}, "per backend in the recipe"),
        ({"raise_on_failure": False}, "never zero rewards"),
    ]:
        with pytest.raises(ConfigError, match=match):
            unirl.RewardPanel(recipe=recipe, config=config)


def test_a_remote_config_points_at_our_servers_only_and_checks_unirls_weighing():
    """Refused before any connection: a managed:// or empty URL, a weighing UniRL would refuse or
    that weighs nothing, zeros on failure; every term is asked of the server (UniRL's rewards are
    made of them here)."""
    url = "http://127.0.0.1:9"
    remote, options, wanted = remote_config(
        {"base_url": url, "required_rewards": ["b"], "timeout": 7, "request_batch_size": 4},
        "PANEL_TOKEN",
    )
    assert (
        remote.urls,
        remote.token_env,
        remote.request_timeout,
        remote.client.request_batch_size,
    ) == (
        [url],
        "PANEL_TOKEN",
        7,
        4,
    )
    assert (wanted, remote.client.required_rewards, options.model_name) == (
        ["b"],
        [],
        "reward_service",
    )
    pinned, _, _ = remote_config({"base_url": url, "expected_scorer_version": "ab" * 32}, None)
    assert (pinned.identity_hash, pinned.revision) == ("ab" * 32, None)  # what the route echoes
    several, _, _ = remote_config({"base_url": [url, "http://127.0.0.1:10"]}, None)
    assert several.urls == [url, "http://127.0.0.1:10"]
    for config, match in [
        ({"base_url": "managed://rank-affine"}, "http\\(s\\) URL of a managed-scorers server"),
        ({"base_url": ""}, "http\\(s\\) URL"),
        (
            {"base_url": url, "required_rewards": ["b"], "reward_weights": {"c": 2.0}},
            r"reward_weights names \['c'\], not in required_rewards \['b'\]",
        ),
        ({"base_url": url, "reward_weights": {"b": 2.0}}, "not in required_rewards"),
        ({"base_url": url, "aggregation_method": "median"}, "aggregation_method must be one of"),
        ({"base_url": url, "sub_metric_reduce": "min"}, "sub_metric_reduce must be one of"),
        ({"base_url": url, "raise_on_failure": False}, "never zero rewards"),
        ({"base_url": url, "retries": 2}, r"unknown field\(s\) \['retries'\]"),
    ]:
        with pytest.raises(ConfigError, match=match):
            unirl.RemoteRewardBackend(config=config)


def test_a_term_that_does_not_apply_reaches_unirl_as_the_zero_it_added_and_components_sum_to_the_reward():  # noqa: E501
    terms = [
        PanelTerm("long", LocalRewardBackend("nonempty"), weight=3.0, applicable_datasets=["chat"]),
        PanelTerm("any", LocalRewardBackend("nonempty"), weight=0.5),
    ]
    request = RewardRequest(
        items=[
            RewardItem(id="c", text="hi", data_source="chat"),
            RewardItem(id="m", text="x", data_source="math"),
        ]
    )
    with RewardPanel(terms) as panel:
        response = panel.compute_rewards(request)
        assert response.component_rewards["long"] == [1.0, None]  # ours: not applicable
        added = contributions(panel.terms, request, response)
    assert added == {"long": [3.0, 0.0], "any": [0.5, 0.5]}  # UniRL's: floats only
    assert [added["long"][i] + added["any"][i] for i in range(2)] == response.rewards == [3.5, 0.5]


def _unirl_request(generated: dict, rate: int | None = 16000) -> SimpleNamespace:
    """UniRL's RewardRequest, duck-typed: `generated` maps a modality to its per-sample objects."""
    columns = {
        kind: SimpleNamespace(to_list=lambda values=values: values)
        for kind, values in generated.items()
    }
    return SimpleNamespace(
        generated=columns, audio_sample_rate=rate, sample_ids=["s0", "s1"], metadata=None
    )


def _waves() -> list[np.ndarray]:
    rng = np.random.default_rng(8)
    return [
        rng.standard_normal(300).astype(np.float32),
        rng.standard_normal((2, 50)).astype(np.float32),
    ]


def _allocate(shape: tuple[int, ...]) -> np.ndarray:
    return np.empty(shape, np.uint8)


def test_unirl_audio_becomes_float32_channels_by_samples_with_the_batchs_rate():
    waves = _waves()
    audio = [SimpleNamespace(waveform=w) for w in waves]
    ours = reward_request(_unirl_request({"audio": audio}), "audio", [], "reference", _allocate)
    assert [item.audio.shape for item in ours.items] == [(1, 300), (2, 50)]  # UniRL's [L] is mono
    assert [item.audio.tobytes() for item in ours.items] == [w.tobytes() for w in waves]
    assert [item.audio_sample_rate for item in ours.items] == [16000, 16000]
    # beside another kind (a text-to-audio-video frontier), the audio travels too
    frames = [SimpleNamespace(frames=np.full((2, 3, 4, 4), 0.5, np.float32)) for _ in range(2)]
    both = reward_request(
        _unirl_request({"video": frames, "audio": audio}), "video", [], "reference", _allocate
    )
    assert [item.video.shape for item in both.items] == [(2, 4, 4, 3)] * 2
    assert [item.audio.tobytes() for item in both.items] == [w.tobytes() for w in waves]


def test_unirl_audio_without_a_rate_or_with_a_nan_is_a_typed_error_naming_the_item():
    audio = [SimpleNamespace(waveform=w) for w in _waves()]
    with pytest.raises(ScorerRequestError, match="without a sample rate") as info:
        reward_request(
            _unirl_request({"audio": audio}, rate=None), "audio", [], "reference", _allocate
        )
    assert info.value.kind == "bad_input"
    audio[1].waveform[1, 7] = np.nan
    with pytest.raises(
        ScorerRequestError,
        match=r"UniRL item 1 \(sample_id 's1'\).*non-finite.*channel 1, sample 7",
    ):
        reward_request(_unirl_request({"audio": audio}), "audio", [], "reference", _allocate)
    with pytest.raises(ScorerRequestError, match="scores 'audio'"):
        reward_request(_unirl_request({"video": []}), "audio", [], "reference", _allocate)


def test_an_audio_history_kind_is_our_audio_scorer_and_says_video_to_unirls_service():
    config = _config(scorer={"name": "audio_loudness", "history_kind": "audio"})
    spec, options = managed_spec(config, "cpu")
    assert (spec.scorer.input_kind, spec.client.input_kind, options.input_kind) == (
        "audio",
        "audio",
        "audio",
    )
    backend = unirl.ManagedScorerProcessBackend(config=config, start=False)
    try:
        # UniRL's RewardService takes image, video, text
        assert backend.preferred_input_kind == "video"
        assert backend.covers_prompt_video() is False  # a loudness reward does not read the prompt
    finally:
        backend.dispose()


def test_unirls_weighing_over_our_terms_is_its_clients_reduce_then_aggregate_by_hand(monkeypatch):
    """UniRL's RemoteRewardBackend rules (remote.py), over a three-term scorer whose reward is one
    term: each reward's sub-metrics reduced, then aggregated with the weights; a reward with no
    value is 0.0 and left out. And UNIRL_MATHVERIFY_TIMEOUT_S becomes math_verify's timeout_s."""
    shape = ScorerShape(name="grey", terms=("half", "bright", "dark"), reward_term="half")
    response = RewardResponse(
        ids=["a", "b"],
        rewards=[0.1, 0.4],
        component_rewards={"half": [0.1, 0.4], "bright": [0.2, 0.8], "dark": [0.8, None]},
        applicable={"dark": [True, False]},  # not for item b (its data source)
    )
    required = ["grey", "dark", "half"]
    cases = {
        ("weighted_sum", "first"): [(2 * 0.1 + 0.5 * 0.8 + 0.1) / 3.5, (2 * 0.4 + 0.4) / 3.0],
        ("mean", "mean"): [((0.1 + 0.2 + 0.8) / 3 + 0.8 + 0.1) / 3, ((0.4 + 0.8) / 2 + 0.4) / 2],
        ("min", "max"): [0.1, 0.4],
        ("max", "first"): [0.8, 0.4],
    }
    for (method, reduce), expected in cases.items():
        client = {
            "reward_weights": {"grey": 2.0, "dark": 0.5},
            "aggregation_method": method,
            "sub_metric_reduce": reduce,
        }
        weighed = weigh(Weighing.of(client, required), response, shape)
        assert weighed.rewards == pytest.approx(expected, rel=1e-12), (method, reduce)
        assert weighed.components["dark"] == [0.8, 0.0] and weighed.successes == [True, True]
    assert weighed.errors[1].startswith("dark: no value") and weighed.errors[0] is None
    with pytest.raises(ConfigError, match=r"\['nope'\] are not served by scorer 'grey'"):
        check_served(Weighing.of({}, ["nope"]), shape)
    math = {"process": {"python_executable": sys.executable}, "scorer": {"name": "math_verify"}}
    monkeypatch.setenv("UNIRL_MATHVERIFY_TIMEOUT_S", "7")
    assert managed_spec(math, None)[0].scorer.params == {"timeout_s": 7}
    own = {**math, "scorer": {"name": "math_verify", "params": {"timeout_s": 3}}}
    assert managed_spec(own, None)[0].scorer.params == {"timeout_s": 3}  # the recipe's wins
    graded = {
        "terms": [{"name": "m", "backend": {"kind": "local", "scorer": {"name": "math_verify"}}}]
    }
    panel, _ = panel_config(graded, {"input_kind": "text"}, None)
    assert panel.terms[0].backend.scorer.params == {"timeout_s": 7}  # a panel's term too
    monkeypatch.setenv("UNIRL_MATHVERIFY_TIMEOUT_S", "0")
    with pytest.raises(ConfigError, match="UNIRL_MATHVERIFY_TIMEOUT_S='0' must be a positive"):
        managed_spec(math, None)
