"""JobRewardBackend: a reward service that answers an enqueue with a job id and is pulled until
done.

Posttrain's video reward service is one: it takes one candidate per request, gives back a job id
(its "uuid"), and is asked for the score until it has one. It offers no idempotency key and no
cancellation, and it does not echo the candidate's identity, so: the enqueue is sent again only
after a 429 (the service says it took nothing); any other failure may leave work running there, it
is never sent again, and the error says so. Pulls are repeated (transport failures, 5xx, 429, and
pending answers) with capped backoff, or after the answer's Retry-After when it asks for longer
(an enqueue's 429 too), until the request's one absolute deadline. A score is taken only from the
pull of its own job id, only before that deadline, only as one finite number, and only when the
service gave that id to no other item (`job_ids`): one id for two uploads fails both items.

The exchanges (paths configurable; `{uuid}` is the job id, percent-quoted):
  POST {base_url}{enqueue_path}         multipart form: `file` (the item's .npy, uint8 video
                                        [1,3,T,H,W] or image [1,H,W,3]), `media_type` ("video" |
                                        "image"), `video_infos` (video only: JSON {"fps": FPS})
                                        -> 2xx {"uuid": "<job id>"}; 429 (Retry-After): sent again
  GET  {base_url}{result_path}          -> 200 {"<score_key>": [<one finite number>]} and nothing
                                        else -> 202 {"uuid": "<the same job id>", "status":
                                        "pending"} -> 400 "Not found scores for <job id>" (legacy
                                        pending: the body,
                                           or the one value of a one-field JSON object)
The bearer token goes on every exchange. Errors: `supervisor.errors.JobError` and its kinds.
"""

from __future__ import annotations

import errno
import json
import logging
import math
import threading
import time
import urllib.parse
from collections.abc import Callable, Sequence
from typing import Any, Literal

import numpy as np

from scorers.common.retry import Retry, retry_after_s
from scorers.diagnostics import report
from scorers.identity import digest
from supervisor.assembly import assemble_response
from supervisor.backends.job_ids import Claim, JobIds, new_call
from supervisor.backends.spool import Spool, Spooled, SpoolWriteFailed
from supervisor.child import ranks
from supervisor.child.client import MAX_CONNECTIONS, HttpxTransport
from supervisor.chunks import check_groups
from supervisor.composition import Component
from supervisor.config import JobBackendConfig, settings
from supervisor.errors import (
    ConnectFailed,
    ConnectionLost,
    ErrorStatus,
    JobDeadline,
    JobEnqueueUncertain,
    JobError,
    JobItemsFailed,
    JobProtocolError,
    JobRejected,
    JobServiceUnavailable,
    JobSpoolFailed,
    NoAnswer,
    ScorerRequestError,
    TransportError,
    excerpt,
)
from supervisor.fanout import on_each
from supervisor.joined import items_failed
from supervisor.outcome import Outcome
from supervisor.shape import ScorerShape
from supervisor.types import RewardItem, RewardRequest

log = logging.getLogger(__name__)
MediaType = Literal["video", "image"]
LEGACY_PENDING = "Not found scores for {uuid}"
# What a JobBackendConfig holds that is no setting of the backend's, and why
NOT_SETTINGS = {
    "kind": "the config union's tag",
    "token_env": "the token's variable: its value is the runtime-only `token`",
}


class _Pending(Exception):
    """The job is not done yet: pull again (after the backoff's pause or its Retry-After, within the
    deadline)."""

    def __init__(self, status: int, body: bytes, retry_after: float | None) -> None:
        self.status, self.body, self.retry_after = status, body, retry_after
        super().__init__(f"HTTP {status}: pending")


class _Status(ErrorStatus):
    """An error status, with the pause its Retry-After asks for (None: none readable)."""

    def __init__(self, status: int, body: bytes, retry_after: float | None) -> None:
        self.retry_after = retry_after
        super().__init__(status, "error", excerpt(body))


class _Busy(_Status):
    """An enqueue's 429: the service took nothing, so the same enqueue goes again after the
    pause."""


def _retryable(exc: Exception) -> bool:
    """Pending, nothing usable came back, or the service (or a proxy) says try later."""
    if isinstance(exc, ErrorStatus):
        return exc.status == 429 or exc.status >= 500
    return isinstance(exc, (_Pending, ConnectFailed, ConnectionLost, NoAnswer))


def _asked(exc: Exception) -> float:
    """The pause an answer asked for (its Retry-After), honoured in full: the deadline bounds it."""
    return getattr(exc, "retry_after", None) or 0.0


def _asked_note(exc: Exception) -> str:
    asked = getattr(exc, "retry_after", None)
    return f" (it asked to be tried again after {asked:g} s)" if asked else ""


def service_array(item: RewardItem, media_type: MediaType) -> np.ndarray:
    """The array the service reads, as a view of the item's (no copy): an RGB uint8 video THWC as
    [1,3,T,H,W]; an image HWC as [1,H,W,3] (the seed's image contract). Anything else is refused."""
    media = item.video if media_type == "video" else item.image
    if media is None or media.shape[-1] != 3:
        got = "none" if media is None else f"{media.shape[-1]} channels"
        raise ScorerRequestError(
            f"item {item.id!r}: the job service takes an RGB {media_type}, got {got}",
            kind="bad_input",
        )
    return media.transpose(3, 0, 1, 2)[None] if media_type == "video" else media[None]


def _json(body: bytes) -> Any:
    try:
        return json.loads(body)
    except ValueError:
        return None


def is_legacy_pending(body: bytes, job_id: str) -> bool:
    """The one 400 that means pending: exactly "Not found scores for <job id>", as the whole body or
    as the one value of a one-field JSON object (a web framework's {"detail": ...})."""
    message = LEGACY_PENDING.format(uuid=job_id)
    parsed = _json(body)
    if isinstance(parsed, dict) and len(parsed) == 1:
        return next(iter(parsed.values())) == message
    return body.decode("utf-8", "replace").strip() == message


def singleton_score(body: bytes, key: str) -> float | None:
    """The one finite score of a 200 that holds nothing else ({key: [score]}); None otherwise."""
    parsed = _json(body)
    if not isinstance(parsed, dict) or list(parsed) != [key]:
        return None
    values = parsed[key]
    if not isinstance(values, list) or len(values) != 1:
        return None
    score = values[0]
    if isinstance(score, bool) or not isinstance(score, (int, float)):
        return None
    try:
        value = float(score)  # a JSON integer too large for a float overflows: not a score
    except OverflowError:
        return None
    return value if math.isfinite(value) else None


class JobRewardBackend(Component):
    """One candidate, one job: each item of a request is enqueued and pulled on its own, up to
    `max_concurrency` at once, all under one deadline (`request_timeout` from the call's start).
    A request with a failed item raises `JobItemsFailed` (each item's typed JobError in `errors`,
    the others' rewards in `partial`, which only an optional panel term takes)."""

    shape: ScorerShape

    def __init__(  # noqa: PLR0913 - every keyword is a field of JobBackendConfig (test_settings_once)
        self,
        base_url: str,
        token: str | None = None,
        *,
        media_type: MediaType = "video",
        fps: float | None = None,
        name: str = "job_service",
        term: str = "score",
        revision: str | None = None,
        request_timeout: float = 600.0,
        enqueue_timeout: float = 120.0,
        pull_timeout: float = 30.0,
        poll_interval_s: float = 0.5,
        poll_backoff_cap_s: float = 5.0,
        max_concurrency: int = 8,
        spool_dir: str | None = None,
        enqueue_path: str = "/enqueue",
        result_path: str = "/result/{uuid}",
        score_key: str = "scores",
        max_answer_bytes: int = 2**20,
        remembered_job_ids: int = 16384,
    ) -> None:
        """`enqueue_timeout` and `pull_timeout` bound one exchange each (connect, send, wait, read),
        never past the request's deadline; pulls (and enqueues answered 429) pause
        `poll_interval_s`, doubling up to `poll_backoff_cap_s`, or longer when the answer's
        Retry-After asks it. The job ids of the last `remembered_job_ids` items (and every item of
        the calls in flight) are kept to refuse one given twice."""
        self.base_url, self.media_type, self.fps, self.term = base_url, media_type, fps, term
        self.request_timeout, self.enqueue_timeout, self.pull_timeout = (
            request_timeout,
            enqueue_timeout,
            pull_timeout,
        )
        self.poll_interval_s, self.poll_backoff_cap_s = poll_interval_s, poll_backoff_cap_s
        self.max_concurrency, self.score_key = max_concurrency, score_key
        self.enqueue_path, self.result_path = enqueue_path, result_path
        self._check_settings()
        self.shape = self._shape(name, revision)
        self._open(token, max_answer_bytes, spool_dir, remembered_job_ids)

    def _check_settings(self) -> None:
        """ValueError for a setting the service cannot be used with, before anything is opened."""
        _check(
            self.media_type,
            self.fps,
            self.request_timeout,
            self.enqueue_timeout,
            self.pull_timeout,
            self.poll_interval_s,
            self.poll_backoff_cap_s,
        )
        if not 1 <= self.max_concurrency <= MAX_CONNECTIONS:
            raise ValueError(
                f"max_concurrency must be in 1..{MAX_CONNECTIONS} (the connections to one service)"
            )
        if (
            not self.enqueue_path.startswith("/")
            or not self.result_path.startswith("/")
            or "{uuid}" not in self.result_path
        ):
            raise ValueError(
                "enqueue_path and result_path start with '/', and result_path holds '{uuid}'"
            )

    def _shape(self, name: str, revision: str | None) -> ScorerShape:
        """The scorer this backend is, its identity every setting that changes a score."""
        identity: dict[str, Any] = {"backend": "jobs", "service": name, "revision": revision}
        identity |= {"media_type": self.media_type, "fps": self.fps, "term": self.term}
        identity |= {"paths": [self.enqueue_path, self.result_path], "score_key": self.score_key}
        identity |= {
            "bounds": [
                self.request_timeout,
                self.enqueue_timeout,
                self.pull_timeout,
                self.poll_interval_s,
                self.poll_backoff_cap_s,
            ]
        }
        return ScorerShape(name, (self.term,), identity_hash=digest(identity), revision=revision)

    def _open(
        self,
        token: str | None,
        max_answer_bytes: int,
        spool_dir: str | None,
        remembered_job_ids: int,
    ) -> None:
        """The state of the calls: stop and interrupt events, the connections, spool and job ids."""
        self._stopped = threading.Event()  # closed: nothing starts, nothing is pulled again
        # set (then replaced) by interrupt(): the calls in flight end
        self._interrupted = threading.Event()
        headers = {"authorization": f"Bearer {token}"} if token else {}
        self._transport = HttpxTransport(self.base_url, headers, max_answer_bytes)
        self.spool = Spool(spool_dir, ranks.current().rank)
        self._job_ids = JobIds(remembered_job_ids)

    @classmethod
    def from_config(cls, config: JobBackendConfig, token: str | None = None) -> JobRewardBackend:
        """The backend a recipe (or the CLI) describes, every setting passed by its name; `token` is
        the value of `config.token_env`."""
        return cls(config.base_url, token, **settings(config, leave={*NOT_SETTINGS, "base_url"}))

    @property
    def combination(self) -> dict[str, Any]:
        return {"required": [self.term], "weights": {}}

    @property
    def call_bound_s(self) -> float:
        return self.request_timeout

    def score(self, request: RewardRequest) -> Outcome:
        deadline = time.monotonic() + self.request_timeout
        # this call's: interrupt() sets it (and replaces it for later calls)
        interrupted = self._interrupted
        call = new_call()
        # bad input: nothing is sent (incomplete groups of a declared size included)
        check_groups(request, self.group_size, "job backend")
        arrays = [service_array(item, self.media_type) for item in request.items]
        try:
            outcomes = on_each(
                list(zip(request.items, arrays, strict=True)),
                lambda pair: self._score_item(pair[0].id, pair[1], deadline, call, interrupted),
                "job",
                limit=self.max_concurrency,
                on_interrupt=self.interrupt,
            )
            return self._response(request, outcomes)
        finally:
            self._job_ids.end_call(call)  # after the response's last check of the call's claims

    def _response(
        self, request: RewardRequest, outcomes: Sequence[tuple[Claim, float] | BaseException]
    ) -> Outcome:
        """Every item's score, or JobItemsFailed naming each failed item (never a partial reward as
        a whole). A score whose job id the service gave another item meanwhile is not taken (the
        last check: every item of the call has its job id by now)."""
        errors: dict[str, JobError] = {}
        scores: dict[str, float] = {}
        for item_id, outcome in zip(request.ids, outcomes, strict=True):
            if isinstance(outcome, JobError):
                errors[item_id] = outcome
            elif isinstance(outcome, BaseException):
                raise outcome  # not a job's failure (a bug, an interrupt): as it is
            elif outcome[0].contested:
                errors[item_id] = _contested(
                    outcome[0], self._where(outcome[0].item_id, "pull", outcome[0].job_id)
                )
            else:
                scores[item_id] = outcome[1]
        ids = [item_id for item_id in request.ids if item_id in scores]
        response = assemble_response(
            ids,
            {self.term: np.array([scores[item_id] for item_id in ids], dtype=np.float64)},
            [self.term],
            {},
            {self.shape.name: report(len(ids), {})},
            self.shape.identity_hash,
        )
        if not errors:
            return Outcome.scored(response)
        failed = {item_id: str(error) for item_id, error in errors.items()}
        message = str(items_failed(self.shape.name, len(request.items), failed, response))
        error = JobItemsFailed(message, errors, response)
        error.__cause__ = next(iter(errors.values()))  # as `raise ... from` the first item's
        return Outcome.items_failed(error, response)

    def _where(self, item_id: str, stage: str, job_id: str | None = None) -> dict[str, Any]:
        where = {"service_url": self.base_url, "item_id": item_id, "stage": stage}
        return where | {"job_id": job_id} if job_id else where

    def _score_item(
        self,
        item_id: str,
        array: np.ndarray,
        deadline: float,
        call: int,
        interrupted: threading.Event,
    ) -> tuple[Claim, float]:
        """One candidate: its claim on its job id, and the score pulled for it. After an interrupt
        of its call, an item not yet sent is never sent."""
        claim = self._enqueue(item_id, array, deadline, call, interrupted)
        try:
            return claim, self._pull(claim, deadline, interrupted)
        finally:
            self._job_ids.pulled(claim)

    def _enqueue(
        self,
        item_id: str,
        array: np.ndarray,
        deadline: float,
        call: int,
        interrupted: threading.Event,
    ) -> Claim:
        """Send the item; its claim on the job id the service gave it. Sent again only after a 429
        (the service took nothing); never after any other failure."""
        where = self._where(item_id, "enqueue")
        if self._stopped.is_set() or interrupted.is_set():
            raise JobServiceUnavailable(
                "the backend was closed or interrupted; nothing was sent", **where
            )
        if deadline <= time.monotonic():
            raise JobDeadline(
                "the request's deadline passed before this item was sent; nothing was sent", **where
            )
        retrying = self._retrying(deadline, interrupted, where, "enqueue", retry_on=(_Busy,))
        try:
            with self.spool.payload(array) as spooled:
                status, body = retrying.call(lambda: self._enqueue_once(spooled, deadline, where))
        except SpoolWriteFailed as exc:
            raise _spool_failed(exc, str(exc.filename), where, sending=False) from exc
        except _Busy as exc:
            raise _enqueue_failed(exc, retrying, self.request_timeout, where) from exc
        return _job_id(
            status, body, where, lambda job_id: self._job_ids.claim(job_id, item_id, call)
        )

    def _enqueue_once(
        self, spooled: Spooled, deadline: float, where: dict[str, Any]
    ) -> tuple[int, bytes]:
        """One upload of the spooled file: the answer's status and body, or `_Busy` for a 429. Its
        file failing to read back (an OSError out of the upload) cuts the upload midway."""
        left = deadline - time.monotonic()
        if left <= 0:
            raise JobDeadline(
                "the request's deadline passed before this item could be sent; nothing was taken",
                **where,
            )
        fields: dict[str, str] = {"media_type": self.media_type}
        if self.media_type == "video":
            fields["video_infos"] = json.dumps({"fps": self.fps})
        spooled.file.seek(0)
        upload = {"file": (f"{self.media_type}.npy", spooled.file, "application/octet-stream")}
        try:
            status, headers, body = self._transport.upload(
                self.enqueue_path, min(self.enqueue_timeout, left), fields, upload
            )
        except ConnectFailed as exc:
            raise JobServiceUnavailable(
                f"no connection opened, nothing was sent ({exc})", **where
            ) from exc
        except TransportError as exc:
            raise JobEnqueueUncertain(
                f"sent, but no usable answer ({exc})", orphaned=True, **where
            ) from exc
        # not a transport fact (those are typed): the file read back for the upload
        except OSError as exc:
            raise _spool_failed(exc, spooled.path, where, sending=True) from exc
        if status == 429:
            raise _Busy(status, body, retry_after_s(headers.get("retry-after")))
        return status, body

    def _retrying(
        self,
        deadline: float,
        interrupted: threading.Event,
        where: dict[str, Any],
        what: str,
        retry_on: tuple[type[Exception], ...],
    ) -> Retry:
        """The one schedule of this backend's repeats: the backoff, or a longer Retry-After in full;
        a pause ends early when the backend is closed or its call interrupted."""
        orphaned = where["stage"] == "pull"  # a pulled job runs on; a 429'd enqueue started nothing

        def pause(seconds: float) -> None:
            if interrupted.wait(seconds) or self._stopped.is_set():
                nothing = "" if orphaned else "; nothing was taken"
                raise JobServiceUnavailable(
                    f"the backend was closed or interrupted{nothing}", orphaned=orphaned, **where
                )

        def log_retry(exc: Exception, attempt: int, seconds: float) -> None:
            if not isinstance(exc, _Pending):
                log.warning(
                    "%s of item %r at %s: attempt %d failed (%s); again in %.2f s",
                    what,
                    where["item_id"],
                    self.base_url,
                    attempt,
                    exc,
                    seconds,
                )

        return Retry(
            deadline,
            self.poll_interval_s,
            self.poll_backoff_cap_s,
            retry_on=retry_on,
            retry_if=_retryable,
            go_on=lambda: not (self._stopped.is_set() or interrupted.is_set()),
            asked_pause=_asked,
            max_asked_pause_s=math.inf,
            on_retry=log_retry,
            sleep=pause,
        )

    def _pull(self, claim: Claim, deadline: float, interrupted: threading.Event) -> float:
        """Pull the job until it holds a score, a terminal answer comes, or the deadline passes."""
        job_id = claim.job_id
        where = self._where(claim.item_id, "pull", job_id)
        path = self.result_path.replace("{uuid}", urllib.parse.quote(job_id, safe=""))
        retrying = self._retrying(
            deadline, interrupted, where, f"pull {job_id}", (TransportError, ErrorStatus, _Pending)
        )
        try:
            return retrying.call(lambda: self._pull_once(path, claim, deadline, where))
        except (TransportError, ErrorStatus, _Pending) as exc:
            raise self._pull_failed(exc, retrying, where) from exc

    def _pull_once(self, path: str, claim: Claim, deadline: float, where: dict[str, Any]) -> float:
        """One pull: the score, or _Pending, a transport fact, ErrorStatus, JobProtocolError (its
        job id given to another item too, before this pull or during it, is one)."""
        job_id = claim.job_id
        left = deadline - time.monotonic()
        if left <= 0:
            raise NoAnswer("the request's deadline passed")
        if claim.contested:
            raise _contested(claim, where)
        status, headers, body = self._transport.request(
            "GET", path, min(self.pull_timeout, left), (), {}
        )
        if time.monotonic() >= deadline:
            raise NoAnswer(f"HTTP {status} came after the request's deadline: not taken")
        retry_after = retry_after_s(headers.get("retry-after"))
        if status == 200:
            score = singleton_score(body, self.score_key)
            if score is None:
                expected = f'{{"{self.score_key}": [<one finite number>]}} and nothing else'
                raise JobProtocolError(
                    f"a 200 must hold {expected}", status=status, body=body, **where
                )
            if claim.contested:
                raise _contested(claim, where)
            return score
        if status == 202:
            parsed = _json(body)
            if (
                not isinstance(parsed, dict)
                or parsed.get("uuid") != job_id
                or parsed.get("status") != "pending"
            ):
                expected = f'{{"uuid": "{job_id}", "status": "pending"}}'
                raise JobProtocolError(
                    f"a 202 must be {expected} (this job's id)", status=status, body=body, **where
                )
            raise _Pending(status, body, retry_after)
        if status == 400 and is_legacy_pending(body, job_id):
            raise _Pending(status, body, retry_after)
        raise _Status(status, body, retry_after)

    def _pull_failed(self, exc: Exception, retrying: Retry, where: dict[str, Any]) -> JobError:
        """The typed error for pulls that ended without a score."""
        status = getattr(exc, "status", None)
        body = (
            exc.body
            if isinstance(exc, _Pending)
            else exc.message
            if isinstance(exc, ErrorStatus)
            else b""
        )
        tries = f"after {retrying.tries} pull{'s' if retrying.tries > 1 else ''}"
        if retrying.gave_up == "stopped":
            return JobServiceUnavailable(
                f"the backend was closed or interrupted {tries}", orphaned=True, **where
            )
        if retrying.gave_up == "deadline":
            last = (
                f"last: {exc}" if not isinstance(exc, _Pending) else "still pending"
            ) + _asked_note(exc)
            message = (
                f"no score within the request's deadline ({self.request_timeout:g} s) "
                f"{tries}, {last}"
            )
            return JobDeadline(message, status=status, body=body, orphaned=True, **where)
        if isinstance(exc, ErrorStatus) and 400 <= exc.status < 500:
            return JobRejected(
                f"refused {tries}; not pulled again", status=status, body=body, **where
            )
        return JobProtocolError(
            f"an answer outside the protocol {tries} ({exc})", status=status, body=body, **where
        )

    def interrupt(self) -> None:
        """Give up on the calls in flight (Ctrl-C): their connections are dropped, nothing is
        retried."""
        interrupted, self._interrupted = self._interrupted, threading.Event()
        interrupted.set()
        self._transport.reset()

    def close(self) -> None:
        """Connections and the spool directory; the service belongs to whoever runs it."""
        self._stop_submissions()
        self._stopped.set()
        self._interrupted.set()
        self._transport.close()
        self.spool.close()


def _spool_failed(
    exc: OSError, path: str, where: dict[str, Any], *, sending: bool
) -> JobSpoolFailed:
    """The item's spool file failed: written (nothing was sent), or read back while it was being
    sent (the upload was cut midway: whether the service took it is unknown, so it is never sent
    again)."""
    code = f"{errno.errorcode.get(exc.errno, exc.errno)}: " if exc.errno else ""
    said = f"({code}{exc.strerror or exc})"
    if sending:
        message = (
            f"its spool file {path} failed to read back while it was sent {said}; the "
            f"upload was cut midway"
        )
    else:
        message = (
            f"its payload could not be written to the spool file {path} {said}; nothing was sent"
        )
    return JobSpoolFailed(message, spool_path=path, errno=exc.errno, orphaned=sending, **where)


def _enqueue_failed(exc: _Busy, retrying: Retry, timeout: float, where: dict[str, Any]) -> JobError:
    """The typed error for enqueues that the service answered 429 until they ended; it took
    nothing."""
    tries = f"{retrying.tries} enqueue{'s' if retrying.tries > 1 else ''}"
    body = excerpt(exc.message)
    if retrying.gave_up == "stopped":
        return JobServiceUnavailable(
            f"the backend was closed or interrupted after {tries} answered 429; nothing was taken",
            status=429,
            body=body,
            **where,
        )
    until = f"until the request's deadline ({timeout:g} s){_asked_note(exc)}"
    message = f"the service answered 429 (busy) to {tries} {until}; nothing was taken"
    return JobDeadline(message, status=429, body=body, **where)


def _contested(claim: Claim, where: dict[str, Any]) -> JobProtocolError:
    """The earlier holder of a job id the service gave again: its score is not taken."""
    rival = claim.rival
    assert rival is not None
    whose = "this call" if rival.call == claim.call else "a later call"
    message = (
        f"the service gave this job id to item {rival.item_id!r} of {whose} too: one job for "
        f"two uploads, "
        "whose score nobody can tell; not taken"
    )
    return JobProtocolError(message, orphaned=True, **where)


def _job_id(
    status: int,
    body: bytes,
    where: dict[str, Any],
    claim: Callable[[str], tuple[Claim, Claim | None]],
) -> Claim:
    """The item's claim on the job id of an enqueue's answer, or the typed error of that answer
    (a job id the service already gave another item is one: that item fails too)."""
    if 400 <= status < 500:
        raise JobRejected(
            "the service refused the enqueue (it is never sent again)",
            status=status,
            body=body,
            **where,
        )
    if not 200 <= status < 300:
        raise JobEnqueueUncertain(
            "the enqueue failed on the service's side",
            status=status,
            body=body,
            orphaned=True,
            **where,
        )
    parsed = _json(body)
    job_id = parsed.get("uuid") if isinstance(parsed, dict) else None
    if not isinstance(job_id, str) or not job_id:
        raise JobProtocolError(
            "the enqueue's answer holds no job id (a non-empty 'uuid')",
            status=status,
            body=body,
            orphaned=True,
            **where,
        )
    claimed, earlier = claim(job_id)
    if earlier is not None:
        message = (
            f"the service already gave this job id to another item "
            f"({earlier.held_by(claimed.call)}): "
            "one job for two uploads, whose score nobody can tell; not pulled"
        )
        raise JobProtocolError(
            message, status=status, body=body, orphaned=True, **where | {"job_id": job_id}
        )
    return claimed


def _check(
    media_type: str,
    fps: float | None,
    request: float,
    enqueue: float,
    pull: float,
    poll: float,
    cap: float,
) -> None:
    if media_type not in ("video", "image"):
        raise ValueError(f"media_type must be video or image, got {media_type!r}")
    if media_type == "video" and (fps is None or not fps > 0):
        raise ValueError("a video service needs an explicit fps > 0")
    if not (request > 0 and enqueue > 0 and pull > 0 and 0 < poll <= cap):
        raise ValueError("need timeouts > 0 and 0 < poll_interval_s <= poll_backoff_cap_s")
