"""`GET /metrics`: the child's own Prometheus text, parsed with prometheus-client's parser; counters
move."""

from __future__ import annotations

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from supervisor import RewardItem, RewardRequest, ScorerRequestError, ScorerTimeout

SCORER = "tests.helpers.fixture_scorers:RefusesText"


def scrape(backend) -> dict[tuple[str, tuple], float]:
    """Every sample as {(name, sorted labels without `scorer` and `rank`): value}, via the child's
    bearer-guarded page."""
    child = backend._child
    answer = httpx.get(
        f"http://127.0.0.1:{child.port}/metrics", headers={"authorization": f"Bearer {child.token}"}
    )
    assert answer.status_code == 200 and answer.headers["content-type"].startswith(
        "text/plain; version=0.0.4"
    )
    samples = {}
    for family in text_string_to_metric_families(answer.text):
        for sample in family.samples:
            labels = dict(sample.labels)
            assert labels.pop("scorer") == "refuses_text"
            # no launcher: rank 0 (the torchrun test checks other ranks)
            assert labels.pop("rank") == "0"
            samples[(sample.name, tuple(sorted(labels.items())))] = sample.value
    return samples


def texts(*values: str) -> RewardRequest:
    return RewardRequest(
        items=[RewardItem(id=f"i{n}", text=value) for n, value in enumerate(values)]
    )


@pytest.mark.slow
def test_child_metrics_count_requests_items_errors_latency_and_residency(managed, trainer_python):
    backend = managed(trainer_python, SCORER)
    before = scrape(backend)
    assert before[("managed_scorers_child_items_total", ())] == 0
    assert before[("managed_scorers_child_residency", (("state", "resident"),))] == 1
    assert before[("managed_scorers_child_resident_memory_bytes", ())] > 10_000_000
    backend.compute_rewards(texts("a", "bb", "ccc"))
    backend.compute_rewards(texts("dd", "e"))
    with pytest.raises(ScorerRequestError, match="poison"):
        backend.compute_rewards(texts("x", "poison"))
    backend.offload()
    after = scrape(backend)
    # the refused request scored nothing
    assert after[("managed_scorers_child_items_total", ())] == 5
    assert (
        after[("managed_scorers_child_requests_total", (("endpoint", "/score"), ("status", "200")))]
        == 2
    )
    assert (
        after[("managed_scorers_child_requests_total", (("endpoint", "/score"), ("status", "422")))]
        == 1
    )
    assert after[("managed_scorers_child_errors_total", (("kind", "bad_input"),))] == 1
    assert after[("managed_scorers_child_score_seconds_count", ())] == 2
    assert after[("managed_scorers_child_request_seconds_count", ())] == 3
    assert after[("managed_scorers_child_score_seconds_bucket", (("le", "+Inf"),))] == 2
    assert after[("managed_scorers_child_in_flight", ())] == 0
    assert after[("managed_scorers_child_residency", (("state", "offloaded"),))] == 1
    assert after[("managed_scorers_child_residency_transitions_total", (("to", "offloaded"),))] == 1


@pytest.mark.slow
def test_metrics_need_the_token_and_count_refused_tokens(managed, trainer_python):
    backend = managed(trainer_python, SCORER)
    answer = httpx.get(f"http://127.0.0.1:{backend._child.port}/metrics")
    assert answer.status_code == 401
    httpx.post(
        f"http://127.0.0.1:{backend._child.port}/no/such/path",
        headers={"authorization": "Bearer wrong"},
    )
    samples = scrape(backend)
    assert (
        samples[
            ("managed_scorers_child_requests_total", (("endpoint", "/metrics"), ("status", "401")))
        ]
        == 1
    )
    assert (
        samples[
            ("managed_scorers_child_requests_total", (("endpoint", "other"), ("status", "401")))
        ]
        == 1
    )
    assert samples[("managed_scorers_child_errors_total", (("kind", "unauthorized"),))] == 2


@pytest.mark.slow
def test_parent_side_counters_for_prometheus_client(managed, trainer_python, image_python):
    import numpy as np
    from prometheus_client import CollectorRegistry, generate_latest

    from supervisor.backends import prometheus

    registry = CollectorRegistry()
    prometheus.register(registry)
    slow = managed(
        trainer_python,
        "tests.helpers.fixture_scorers:Probe",
        params={"sleep_s": 5.0},
        process={"request_timeout": 1},
    )
    images = managed(
        image_python, "mean_intensity", "image", client={"shared_memory_min_bytes": 1024}
    )

    def value(name: str, backend, **labels: str) -> float:
        found = registry.get_sample_value(
            name,
            {
                "scorer": backend.spec.scorer.name,
                "backend": backend.metrics_id,
                "rank": "0",
                **labels,
            },
        )
        assert found is not None, (name, labels, generate_latest(registry).decode())
        return found

    assert value("managed_scorers_timeouts_total", slow) == 0
    for _ in range(2):  # each call passes its deadline; the second first restarts the killed child
        with pytest.raises(ScorerTimeout):
            slow.compute_rewards(texts("a"))
    assert value("managed_scorers_timeouts_total", slow) == 2
    assert value("managed_scorers_restarts_total", slow) == 1
    big = np.zeros((64, 64, 3), np.uint8)
    images.compute_rewards(RewardRequest(items=[RewardItem(id="i", image=big)]))
    assert (
        value("managed_scorers_transport_bytes_total", images, path="shared_copied") == big.nbytes
    )
    with images.arena() as arena:
        placed = arena.empty((64, 64, 3))
        placed[...] = 7
        images.compute_rewards(RewardRequest(items=[RewardItem(id="j", image=placed)]))
    assert (
        value("managed_scorers_transport_bytes_total", images, path="shared_in_place") == big.nbytes
    )
    # both went shared
    assert value("managed_scorers_transport_bytes_total", images, path="in_band") == 0
    # under shared_memory_min_bytes: the whole body travels in-band
    tiny = np.zeros((4, 4, 3), np.uint8)
    images.compute_rewards(RewardRequest(items=[RewardItem(id="k", image=tiny)]))
    assert value("managed_scorers_transport_bytes_total", images, path="in_band") > tiny.nbytes
