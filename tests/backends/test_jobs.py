"""The job backend (enqueue, then pull until done) against a fake job service on a real socket:
what reaches the service, what is retried and what never is, and each way the service can fail."""

from __future__ import annotations

import email.utils
import math
import os
import stat
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from scorers.common.retry import retry_after_s
from supervisor.backends.job_ids import JobIds
from supervisor.backends.jobs import JobRewardBackend
from supervisor.compose.recipes import build_panel
from supervisor.config import PanelConfig
from supervisor.errors import (
    JobDeadline,
    JobEnqueueUncertain,
    JobItemsFailed,
    JobProtocolError,
    JobRejected,
    JobServiceUnavailable,
    ScorerRequestError,
)
from supervisor.types import RewardItem, RewardRequest
from tests.backends.conftest import FAST, TOKEN
from tests.conftest import eventually
from tests.helpers.fake_jobs import Upload

pytestmark = pytest.mark.usefixtures("no_thread_left")


def video(seed: int, frames: int = 3) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (frames, 8, 10, 3), dtype=np.uint8)


def request(*seeds: int) -> RewardRequest:
    return RewardRequest(items=[RewardItem(id=f"v{seed}", video=video(seed)) for seed in seeds])


def only_error(excinfo: pytest.ExceptionInfo[JobItemsFailed], item_id: str = "v1") -> Exception:
    assert list(excinfo.value.errors) == [item_id] and excinfo.value.partial.ids == []
    return excinfo.value.errors[item_id]


def test_each_video_reaches_the_service_as_its_array_from_a_private_spool_file(
    service, backend, tmp_path
):
    seen_in_spool = []

    def look(upload: Upload) -> None:
        (name,) = os.listdir(backend.spool.dir)  # the file being streamed is there, and private
        path = Path(backend.spool.dir, name)
        modes = (
            stat.S_IMODE(path.stat().st_mode),
            stat.S_IMODE(Path(backend.spool.dir).stat().st_mode),
        )
        seen_in_spool.append((path.stat().st_size, modes))

    service.on_enqueue = look
    backend.max_concurrency = 1  # one upload at a time: one spool file to look at
    response = backend.compute_rewards(request(1, 2))
    by_id = {f"v{seed}": video(seed) for seed in (1, 2)}
    assert [u.array.shape for u in service.uploads] == [
        (1, 3, 3, 8, 10)
    ] * 2 and service.enqueues == 2
    for upload, item_id in zip(service.uploads, ("v1", "v2"), strict=True):
        assert np.array_equal(upload.array, by_id[item_id].transpose(3, 0, 1, 2)[None])
        assert upload.array.dtype == np.uint8
        assert (
            upload.fields["media_type"] == b"video"
            and upload.fields["video_infos"] == b'{"fps": 16.0}'
        )
    assert response.rewards == pytest.approx([float(by_id[i].mean()) for i in ("v1", "v2")])
    assert all(size > 3 * 3 * 8 * 10 and modes == (0o600, 0o700) for size, modes in seen_in_spool)
    assert backend.spool.files() == [] and Path(backend.spool.dir).parent == tmp_path
    calls = [u.authorization for u in service.uploads] + [p.authorization for p in service.pulls]
    assert calls and set(calls) == {f"Bearer {TOKEN}"}


@pytest.mark.parametrize("pending", ["202", "legacy 400"])
def test_a_pending_answer_is_pulled_again_until_the_score(service, backend, pending):
    def pull(job_id: str, n: int):
        if n > 2:
            return None
        return (
            (202, {"uuid": job_id, "status": "pending"})
            if pending == "202"
            else (400, f"Not found scores for {job_id}")
        )

    service.on_pull = pull
    response = backend.compute_rewards(request(1))
    assert response.rewards == pytest.approx([float(video(1).mean())]) and len(service.pulls) == 3


def test_another_400_is_terminal_and_pulled_once(service, backend):
    service.on_pull = lambda job_id, n: (400, {"detail": f"Not found scores for {job_id}x"})
    with pytest.raises(JobItemsFailed) as excinfo:
        backend.compute_rewards(request(1))
    error = only_error(excinfo)
    assert isinstance(error, JobRejected) and error.status == 400 and len(service.pulls) == 1
    assert (
        error.job_id == service.uploads[0].job_id
        and error.job_id in str(error)
        and service.url in str(error)
    )
    assert "v1" in str(error) and "scores for" in error.body and not error.orphaned


@pytest.mark.parametrize("status", [500, 503, 429])
def test_5xx_and_429_are_retried_with_backoff(service, backend, status):
    service.on_pull = lambda job_id, n: (status, "busy") if n <= 3 else None
    response = backend.compute_rewards(request(1))
    assert response.rewards == pytest.approx([float(video(1).mean())]) and service.enqueues == 1
    gaps = np.diff([pull.at for pull in service.pulls])
    # each pull came at least its pause after the one before (0.02, 0.04, 0.08: doubling); a loaded
    # machine only adds to a gap, so these are bounds from below, never a comparison of two gaps
    assert len(gaps) == 3 and all(
        gap >= pause for gap, pause in zip(gaps, (0.02, 0.04, 0.08), strict=True)
    ), gaps


def test_a_202_for_another_job_is_a_protocol_error(service, backend):
    service.on_pull = lambda job_id, n: (202, {"uuid": "someone-else", "status": "pending"})
    with pytest.raises(JobItemsFailed) as excinfo:
        backend.compute_rewards(request(1))
    error = only_error(excinfo)
    assert isinstance(error, JobProtocolError) and error.status == 202 and len(service.pulls) == 1


@pytest.mark.parametrize(
    "body",
    [
        '{"scores": [NaN]}',
        '{"scores": [Infinity]}',
        {"scores": [1.0], "uuid": "x"},
        {"scores": [1.0, 2.0]},
        {},
    ],
)
def test_a_200_that_is_not_one_finite_score_is_a_protocol_error(service, backend, body):
    service.on_pull = lambda job_id, n: (200, body)
    with pytest.raises(JobItemsFailed) as excinfo:
        backend.compute_rewards(request(1))
    error = only_error(excinfo)
    assert isinstance(error, JobProtocolError) and error.status == 200 and len(service.pulls) == 1


@pytest.mark.parametrize("failure", ["500", "drop"])
def test_a_failed_enqueue_is_never_sent_again_and_says_work_may_be_orphaned(
    service, backend, failure
):
    service.on_enqueue = lambda upload: (500, "boom") if failure == "500" else "drop"
    with pytest.raises(JobItemsFailed) as excinfo:
        backend.compute_rewards(request(1))
    error = only_error(excinfo)
    assert isinstance(error, JobEnqueueUncertain) and error.orphaned and "orphaned" in str(error)
    assert service.enqueues == 1 and service.pulls == [] and backend.spool.files() == []
    assert error.status == (500 if failure == "500" else None) and error.stage == "enqueue"


def test_a_score_after_the_deadline_is_not_taken(service, tmp_path):
    """The job is pending until the request's deadline has surely passed (0.8 s after its enqueue
    arrived: the call started before that), then it has a score: the backend never takes it,
    whenever its last pull went out or its answer came on a loaded machine."""

    def on_pull(job_id: str, n: int) -> object:
        if time.monotonic() < service.upload_of(job_id).at + 0.8:
            return (202, {"uuid": job_id, "status": "pending"})
        return None  # the score

    service.on_pull = on_pull
    with JobRewardBackend(
        service.url, TOKEN, spool_dir=str(tmp_path), request_timeout=0.8, **FAST
    ) as backend:
        with pytest.raises(JobItemsFailed) as excinfo:
            backend.compute_rewards(request(1))
    error = only_error(excinfo)
    assert isinstance(error, JobDeadline) and error.orphaned
    assert "no score within the request's deadline (0.8 s)" in str(error), error


def test_a_service_that_hangs_is_bounded_by_the_deadline(service, tmp_path):
    service.on_pull = lambda job_id, n: ("hang", 10.0)
    started = time.monotonic()
    with JobRewardBackend(
        service.url, TOKEN, spool_dir=str(tmp_path), request_timeout=0.6, **FAST
    ) as backend:
        with pytest.raises(JobItemsFailed) as excinfo:
            backend.compute_rewards(request(1))
    # the answer would come after 10 s: the call ends at its 0.6 s deadline (the bound leaves a
    # loaded machine room)
    assert isinstance(only_error(excinfo), JobDeadline) and time.monotonic() - started < 5.0


@pytest.mark.parametrize("token", [None, "wrong"])
def test_a_missing_or_wrong_token_is_a_401(service, tmp_path, token):
    with JobRewardBackend(
        service.url, token, spool_dir=str(tmp_path), request_timeout=5.0, **FAST
    ) as backend:
        with pytest.raises(JobItemsFailed) as excinfo:
            backend.compute_rewards(request(1))
        assert backend.spool.files() == []
    error = only_error(excinfo)
    assert isinstance(error, JobRejected) and error.status == 401 and error.stage == "enqueue"
    assert service.enqueues == 1 and not error.orphaned and "bad or missing token" in error.body


def test_one_failed_item_fails_the_request_and_names_it_the_others_are_only_partial(
    service, backend
):
    second = video(2).transpose(3, 0, 1, 2)[None]
    service.on_pull = lambda job_id, n: (
        (400, "no") if np.array_equal(service.upload_of(job_id).array, second) else None
    )
    with pytest.raises(JobItemsFailed) as excinfo:
        backend.compute_rewards(request(1, 2, 3))
    assert list(excinfo.value.errors) == ["v2"] and isinstance(
        excinfo.value.errors["v2"], JobRejected
    )
    assert excinfo.value.partial.ids == ["v1", "v3"] and "v2" in str(excinfo.value)
    assert excinfo.value.__cause__ is excinfo.value.errors["v2"]


def test_items_go_concurrently_up_to_the_bound(service, tmp_path):
    """Each enqueue is answered only once another is in flight beside it: items sent one at a time
    would break the barrier (an error); more than two at once would show in max_in_flight."""
    pair = threading.Barrier(2, timeout=10)

    def in_pairs(upload: object) -> None:
        pair.wait()  # the default answer once two are here

    service.on_enqueue = in_pairs
    with JobRewardBackend(
        service.url, TOKEN, spool_dir=str(tmp_path), max_concurrency=2, **FAST
    ) as backend:
        assert len(backend.compute_rewards(request(1, 2, 3, 4)).rewards) == 4
    assert service.max_in_flight == 2


def test_an_item_without_an_rgb_video_is_refused_before_anything_is_sent(service, backend):
    with pytest.raises(ScorerRequestError, match="RGB video"):
        backend.compute_rewards(RewardRequest(items=[RewardItem(id="t", text="no video")]))
    assert service.enqueues == 0


def test_closing_removes_the_spool_directory(service, tmp_path):
    backend = JobRewardBackend(service.url, TOKEN, spool_dir=str(tmp_path), **FAST)
    assert math.isfinite(backend.compute_rewards(request(1)).rewards[0])
    backend.close()
    assert list(tmp_path.iterdir()) == []


def test_a_panel_term_names_a_job_service_by_its_config(service, tmp_path, monkeypatch):
    monkeypatch.setenv("JOB_TOKEN", TOKEN)
    backend = {
        "kind": "jobs",
        "base_url": service.url,
        "token_env": "JOB_TOKEN",
        "spool_dir": str(tmp_path),
        **FAST,
    }
    config = PanelConfig.model_validate(
        {"terms": [{"name": "video", "backend": backend, "weight": 2.0}]}
    )
    with build_panel(config) as panel:
        response = panel.compute_rewards(request(1))
    assert response.rewards == pytest.approx([2.0 * float(video(1).mean())])
    assert (
        service.uploads[0].fields["video_infos"] == b'{"fps": 16.0}'
        and list(tmp_path.iterdir()) == []
    )


def test_an_interrupt_ends_the_call_and_sends_no_item_that_was_not_yet_sent(service, backend):
    """Ctrl-C while the first job is pending: its pulls stop, and the items queued behind it are
    never enqueued (no new remote work after the interrupt)."""
    service.on_pull = lambda job_id, n: (202, {"uuid": job_id, "status": "pending"})
    backend.max_concurrency = 1
    outcome: list[BaseException] = []

    def call() -> None:
        try:
            backend.compute_rewards(request(1, 2, 3, 4))
        except BaseException as exc:  # noqa: BLE001 - the test reads it
            outcome.append(exc)

    caller = threading.Thread(target=call)
    caller.start()
    assert eventually(lambda: len(service.pulls) >= 2, timeout=5)
    backend.interrupt()
    caller.join(timeout=5)
    assert not caller.is_alive() and len(outcome) == 1
    assert service.enqueues == 1  # the three items queued behind the first were never sent
    assert isinstance(outcome[0], JobItemsFailed) and "interrupted" in str(outcome[0])


def images(*means: int) -> RewardRequest:
    """Flat images whose true means are `means` (a service that mixes them up is seen at once)."""
    return RewardRequest(
        items=[
            RewardItem(id=f"i{mean}", image=np.full((4, 5, 3), mean, dtype=np.uint8))
            for mean in means
        ]
    )


def pending(job_id: str) -> tuple[int, dict[str, str]]:
    return 202, {"uuid": job_id, "status": "pending"}


def test_one_job_id_for_several_enqueues_fails_every_item_that_got_it(service, tmp_path):
    """Issue 37 item 2: a service answering "job-1" to every enqueue gave every item one upload's
    score. Now each item fails as a protocol error naming the other holder and the URL."""
    service.job_id = "job-1"
    with JobRewardBackend(
        service.url, TOKEN, media_type="image", spool_dir=str(tmp_path), request_timeout=5.0, **FAST
    ) as backend:
        with pytest.raises(JobItemsFailed) as excinfo:
            backend.compute_rewards(images(0, 100, 200))
    errors = excinfo.value.errors
    assert sorted(errors) == ["i0", "i100", "i200"] and excinfo.value.partial.ids == []
    for item_id, error in errors.items():
        others = {"i0", "i100", "i200"} - {item_id}
        assert isinstance(error, JobProtocolError) and error.job_id == "job-1" and error.orphaned
        assert service.url in str(error) and repr(item_id) in str(error)
        assert any(repr(other) in str(error) for other in others), str(error)
    assert service.enqueues == 3 and {pull.job_id for pull in service.pulls} <= {"job-1"}


def test_a_job_id_given_again_in_a_later_call_is_refused(service, backend):
    """A job id this backend already took a score for is not pulled for another item."""
    service.job_id = "job-1"
    assert backend.compute_rewards(request(1)).rewards == pytest.approx([float(video(1).mean())])
    with pytest.raises(JobItemsFailed) as excinfo:
        backend.compute_rewards(request(2))
    error = only_error(excinfo, "v2")
    assert (
        isinstance(error, JobProtocolError) and error.stage == "enqueue" and error.job_id == "job-1"
    )
    assert "item 'v1' of an earlier call, its pull ended" in str(error) and len(service.pulls) == 1
    service.job_id = None  # a service that behaves again is served again
    assert backend.compute_rewards(request(3)).rewards == pytest.approx([float(video(3).mean())])


def test_a_job_id_still_pulled_by_another_call_fails_both(service, backend):
    """Two calls at once (submit): the later one's enqueue gets the id the earlier one is pulling.
    Neither takes a score: the earlier one's next pull sees the id contested."""
    service.job_id = "job-1"
    release = threading.Event()
    service.on_pull = lambda job_id, n: None if release.is_set() else pending(job_id)
    earlier = backend.submit(request(1))
    assert eventually(lambda: len(service.pulls) >= 1, timeout=5)
    with pytest.raises(JobItemsFailed) as later:
        backend.compute_rewards(request(2))
    assert "item 'v1' of an earlier call, still pulled" in str(only_error(later, "v2"))
    release.set()
    with pytest.raises(JobItemsFailed) as excinfo:
        earlier.result(timeout=5)
    error = only_error(excinfo, "v1")
    assert isinstance(error, JobProtocolError) and "item 'v2' of a later call" in str(error)


@pytest.mark.parametrize("remembered", [0, 2])
def test_the_job_ids_remembered_are_bounded_but_a_call_keeps_all_of_its_own(remembered):
    """An item whose pull ended keeps its id while its call runs: an id given again to a later item
    of the same call is caught whatever `remembered` is (it bounds only what is kept across
    calls)."""
    job_ids = JobIds(remembered=remembered)
    claims = [job_ids.claim(f"job-{n}", f"v{n}", call=1)[0] for n in range(3)]
    for claim in claims:
        job_ids.pulled(claim)
    assert len(job_ids) == 3  # the call is in flight: all kept
    assert job_ids.claim("job-0", "v3", call=1)[1] is claims[0] and claims[0].contested
    job_ids.end_call(1)
    assert len(job_ids) == remembered and job_ids.claim("job-0", "again", call=2)[1] is None
    assert (job_ids.claim("job-2", "again", call=2)[1] is claims[2]) == bool(remembered)


def test_an_enqueue_answered_429_is_sent_again_after_its_retry_after(service, backend):
    """Issue 37 item 9: a 429 to an enqueue was a final rejection. The service took nothing, so the
    same upload goes again, no sooner than its Retry-After (longer than the backoff's cap here)."""
    service.on_enqueue = lambda upload: (
        (429, "busy", {"retry-after": "0.3"}) if service.enqueues <= 2 else None
    )
    response = backend.compute_rewards(request(1))
    assert response.rewards == pytest.approx([float(video(1).mean())]) and service.enqueues == 3
    assert all(np.array_equal(upload.array, service.uploads[0].array) for upload in service.uploads)
    assert all(gap >= 0.3 for gap in np.diff([upload.at for upload in service.uploads]))
    assert len(service.pulls) == 1 and service.pulls[0].job_id == service.uploads[2].job_id
    assert backend.spool.files() == []


def test_an_enqueue_whose_retry_after_passes_the_deadline_fails_at_once_and_took_nothing(
    service, backend
):
    """A Retry-After the deadline (5 s) cannot honour ends the item at once: no pause, no second
    try."""
    service.on_enqueue = lambda upload: (429, "busy", {"retry-after": "30"})
    with pytest.raises(JobItemsFailed) as excinfo:
        backend.compute_rewards(request(1))
    error = only_error(excinfo)
    assert isinstance(error, JobDeadline) and error.status == 429 and error.stage == "enqueue"
    assert not error.orphaned and "after 30 s" in str(error) and "nothing was taken" in str(error)
    assert service.enqueues == 1 and "1 enqueue " in str(error)


def test_an_interrupt_while_an_enqueue_waits_out_a_429_sends_it_no_more(service, backend):
    service.on_enqueue = lambda upload: (429, "busy", {"retry-after": "3"})
    outcome: list[BaseException] = []

    def call() -> None:
        try:
            backend.compute_rewards(request(1))
        except BaseException as exc:  # noqa: BLE001 - the test reads it
            outcome.append(exc)

    caller = threading.Thread(target=call)
    caller.start()
    assert eventually(lambda: service.enqueues == 1, timeout=5)
    backend.interrupt()
    caller.join(timeout=5)
    assert not caller.is_alive() and len(outcome) == 1 and isinstance(outcome[0], JobItemsFailed)
    error = outcome[0].errors["v1"]
    assert isinstance(error, JobServiceUnavailable) and not error.orphaned and service.enqueues == 1


@pytest.mark.parametrize("answer", ["429", "503", "202"])
def test_a_pull_waits_out_the_retry_after_it_is_given(service, backend, answer):
    """Pulls ignored Retry-After (a 429, a 503, a pending 202 with one came back after the
    backoff)."""

    def pull(job_id: str, n: int):
        if n > 1:
            return None
        headers = {"retry-after": "0.3"}
        return (*pending(job_id), headers) if answer == "202" else (int(answer), "later", headers)

    service.on_pull = pull
    response = backend.compute_rewards(request(1))
    assert response.rewards == pytest.approx([float(video(1).mean())]) and len(service.pulls) == 2
    assert service.pulls[1].at - service.pulls[0].at >= 0.3


def test_a_pull_whose_retry_after_passes_the_deadline_ends_at_once(service, backend):
    service.on_pull = lambda job_id, n: (*pending(job_id), {"retry-after": "60"})
    with pytest.raises(JobItemsFailed) as excinfo:
        backend.compute_rewards(request(1))
    error = only_error(excinfo)
    assert isinstance(error, JobDeadline) and error.orphaned and "after 60 s" in str(error)
    assert len(service.pulls) == 1


def test_retry_after_is_read_in_seconds_or_as_an_http_date():
    assert (
        retry_after_s("2") == 2.0 and retry_after_s(" 0.5 ") == 0.5 and retry_after_s("-3") == 0.0
    )
    assert (
        retry_after_s(None) is None
        and retry_after_s("soon") is None
        and retry_after_s("nan") is None
    )
    in_ten = email.utils.formatdate(time.time() + 10, usegmt=True)
    assert (
        5 < (retry_after_s(in_ten) or 0) <= 10
        and retry_after_s("Wed, 21 Oct 2015 07:28:00 GMT") == 0.0
    )
