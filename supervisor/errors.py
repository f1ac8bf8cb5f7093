"""Typed failures, and the one place where a failed exchange becomes one.

The HTTP clients raise *transport facts* (`TransportError` and its kinds, or
`ErrorStatus` for a non-2xx answer), mapped once from OSError/httpx at their
boundary. Backends decide what a fact means for the child (kill it? restart
later?) and raise the trainer-facing `ScorerError` built by `scorer_error`.
Where a child is involved, the error carries its failure record. Inside the
library a backend's answer is a value (`supervisor.outcome.Outcome`); these are
raised once, at the trainer's boundary. Every class has one parent:

    ScorerError                     what a trainer catches (`record`: the child, when one is
                                    involved)
    +-- ScorerStartupError          the child did not become ready
    +-- ScorerProcessDied           the child is gone
    |   +-- ScorerCrashLoop         ... and kept dying
    |   +-- PoolActorDied           a Ray pool's actor died holding a share
    +-- ScorerTimeout               a call passed its deadline (its child killed)
    +-- ScorerRequestError          the scorer answered an error (`kind`)
    |   +-- ScorerItemsFailed       some items not scored (`failed`; read-only `partial`: the
                                    others)
    |   |   +-- JobItemsFailed      ... by a job service (`errors`: each item's JobError)
    |   +-- ScorerTermsFailed       some terms failed alone (read-only `response`: every item)
    |   +-- GroupsIncomplete        groups not of the declared size (`group_size`, `counts`)
    |   +-- GroupSizeConflict       a request's group size against the configured one
    +-- ScorerUnavailable           a remote server cannot be reached
    +-- RewardContractError         rewards broke the contract
    |   +-- ScorerIdentityChanged   an answer of another scorer identity
    |       +-- PoolIdentityChanged ... from a Ray pool's actor
    +-- BackendNotOwned             a fork called its parent's backend
    +-- RankFailed                  a step failed on some rank (DistributedRewards)
    +-- RankLost                    a peer rank left the exchange
    +-- JobError                    one item's call to a job service (where, what came back)
        +-- JobEnqueueUncertain     the enqueue may have reached it (orphaned)
        +-- JobServiceUnavailable   nothing reached it
        +-- JobSpoolFailed          the payload could not be spooled
        +-- JobRejected             a 4xx for good
        +-- JobProtocolError        an answer outside the protocol
        +-- JobDeadline             the deadline passed first

    ConfigError(ValueError)         a configuration cannot work
    TransportError, ErrorStatus     transport facts: never reach a trainer
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Literal

from child_runtime.protocol.exit_codes import describe
from child_runtime.protocol.headers import IDENTITY_HEADER
from child_runtime.protocol.wire import WEDGED
from scorers.common.processes import signal_name


@dataclass(frozen=True)
class ChildRecord:
    """Who the child was and how it ended: enough to debug without reproducing."""

    name: str
    pid: int | None
    returncode: int | None = None
    log_path: str | None = None
    log_tail: str = ""
    at: float = field(default_factory=time.time)
    # None: infer from returncode; True with returncode None: status lost
    exited: bool | None = None
    rank: int | None = None

    @property
    def exit_status(self) -> str:
        if self.returncode is None and self.exited:
            return (
                "exited, status unknown (SIGCHLD is ignored here and the kernel could not "
                "report it)"
            )
        return describe(self.returncode)

    @property
    def signal_name(self) -> str | None:
        if self.returncode is not None and self.returncode < 0:
            return signal_name(-self.returncode)
        return None

    @property
    def exitcode(self) -> int | None:
        if self.returncode is not None and self.returncode >= 0:
            return self.returncode
        return None

    def render(self) -> str:
        tail = self.log_tail.rstrip()
        rank = f" rank={self.rank}" if self.rank is not None else ""
        lines = [
            f"child {self.name!r}{rank} pid={self.pid} status={self.exit_status} "
            f"log={self.log_path}"
        ]
        if tail:
            lines.append("--- log tail ---\n" + tail)
        return "\n".join(lines)


class ScorerError(RuntimeError):
    """Base of every managed-scorers failure; `record` is set where a child is involved."""

    def __init__(self, message: str, record: ChildRecord | None = None) -> None:
        self.record = record
        super().__init__(message if record is None else f"{message}\n{record.render()}")

    @property
    def pid(self) -> int | None:
        return self.record.pid if self.record else None

    @property
    def returncode(self) -> int | None:
        return self.record.returncode if self.record else None

    @property
    def signal_name(self) -> str | None:
        return self.record.signal_name if self.record else None

    @property
    def log_tail(self) -> str:
        return self.record.log_tail if self.record else ""


class ScorerStartupError(ScorerError):
    """The child did not become ready: it exited, timed out, or reported a boot failure."""

    def __init__(
        self, message: str, record: ChildRecord | None = None, boot_code: int | None = None
    ) -> None:
        # the reserved exit code the child reported on its readiness pipe
        self.boot_code = boot_code
        super().__init__(message, record)


class ScorerProcessDied(ScorerError):
    """The child is gone (crash, kill, OOM) while it was expected to serve."""


class PoolActorDied(ScorerProcessDied):
    """An actor of a Ray reward pool (`compose.ray_pool`) died while it held a share of a call:
    killed, out of memory, or its node lost. Names the actor, its node and its pid. Ray restarts it
    under the pool's `max_restarts`; the share is not re-sent unless the pool's `max_task_retries`
    allows it."""

    def __init__(
        self,
        message: str,
        actor: str = "",
        node_id: str | None = None,
        node_ip: str | None = None,
        actor_pid: int | None = None,
    ) -> None:
        self.actor, self.node_id, self.node_ip, self.actor_pid = actor, node_id, node_ip, actor_pid
        super().__init__(message)


class ScorerCrashLoop(ScorerProcessDied):
    """The child kept dying: more restarts in the policy window than it allows."""


class ScorerTimeout(ScorerError):
    """A call passed its deadline; the child was killed because its state is unknown."""


class ScorerRequestError(ScorerError):
    """The child answered with an error status (bad input, scorer exception, conflict)."""

    def __init__(
        self,
        message: str,
        record: ChildRecord | None = None,
        status: int | None = None,
        kind: str | None = None,
    ) -> None:
        self.status = status
        self.kind = kind
        super().__init__(message, record)


class GroupsIncomplete(ScorerRequestError):
    """A declared group size that the request's groups do not have: refused before any scorer
    runs, whatever the backend or scorer (pointwise ones included). `group_size`, and `counts`:
    each incomplete group's id -> how many candidates it has."""

    def __init__(self, message: str, group_size: int, counts: dict[str, int]) -> None:
        super().__init__(message, kind="bad_input")
        self.group_size, self.counts = group_size, counts


class GroupSizeConflict(ScorerRequestError):
    """A request declares a group size other than the one configured: a request never overrides
    the config. `requested`, `configured`: the two sizes."""

    def __init__(self, requested: int, configured: int, where: str) -> None:
        super().__init__(
            f"request declares group_size {requested}, the {where}'s config {configured}: a "
            f"request cannot override a configured group size (drop it from the request, or "
            f"configure {requested})",
            kind="bad_input",
        )
        self.requested, self.configured = requested, configured


class ScorerItemsFailed(ScorerRequestError):
    """The scorer answered, but could not score some items (`failed`: id -> why). `partial` is the
    response for the other items: a panel keeps it when the term is optional; a trainer calling
    the backend alone gets this error, never a reward standing in for the missing ones."""

    def __init__(
        self,
        message: str,
        record: ChildRecord | None = None,
        status: int | None = None,
        kind: str | None = "items_failed",
        failed: dict[str, str] | None = None,
        partial: Any = None,
    ) -> None:
        self.failed = dict(failed or {})
        self.partial = partial  # a RewardResponse over the scored ids (types imports this module)
        super().__init__(message, record, status, kind)


class ScorerTermsFailed(ScorerRequestError):
    """The scorer answered every item, but failed some of its terms for some of them
    (`ScoreResult.term_failed`; `failed`: id -> why). `response` holds every item, those terms None
    there and named in its term_failures. Nothing below a panel knows whether such a term is
    optional: a trainer calling the backend alone gets this error, never a reward summed without the
    term; a panel term bound to that component records it when optional and raises when required."""

    def __init__(
        self,
        message: str,
        failed: dict[str, str] | None = None,
        response: Any = None,
        record: ChildRecord | None = None,
        # defaults: an exception is unpickled as cls(*args), then its fields (a Ray actor's, say)
    ) -> None:
        self.failed = dict(failed or {})
        self.response = response  # a RewardResponse over every id (types imports this module)
        super().__init__(message, record, None, "term_failed")


class ScorerUnavailable(ScorerError):
    """A remote scorer server cannot be reached (refused, reset, DNS)."""


class RewardContractError(ScorerError):
    """Rewards broke the contract: wrong ids or order, wrong count, non-finite, missing term."""


class ScorerIdentityChanged(RewardContractError):
    """An answer of another scorer identity than the backend was made for (its /health, its child's
    readiness line, or its `identity_hash` pin), or of none: a server restarted or redeployed with
    another revision or params, or one older than the identity header (a version mismatch). Never
    retried nor re-sent elsewhere: no reward of another identity enters a call. `url`, and both
    hashes: `expected`, `got` (None: the answer named none)."""

    def __init__(
        self,
        message: str,
        record: ChildRecord | None = None,
        url: str = "",
        expected: str | None = None,
        got: str | None = None,
    ) -> None:  # defaults: an exception is unpickled as cls(*args), then its fields
        self.url, self.expected, self.got = url, expected, got
        super().__init__(message, record)


class PoolIdentityChanged(ScorerIdentityChanged):
    """An actor of a Ray reward pool answered from a child of another scorer identity than the
    pool's: Ray restarted (or someone replaced) the actor on a node whose scorer env now holds
    another revision or params. Names the actor, its node and pid, and both hashes; nothing of the
    call is joined, the other actors' answers included."""

    def __init__(
        self,
        message: str,
        actor: str = "",
        node_id: str | None = None,
        node_ip: str | None = None,
        actor_pid: int | None = None,
        expected: str | None = None,
        got: str | None = None,
    ) -> None:
        self.actor, self.node_id, self.node_ip, self.actor_pid = actor, node_id, node_ip, actor_pid
        super().__init__(message, expected=expected, got=got)


class BackendNotOwned(ScorerError):
    """A forked copy of the trainer called a backend whose child belongs to the process that
    forked."""


class RankFailed(ScorerError):
    """A reward step failed on one or more trainer ranks (`DistributedRewards`). Every rank raises
    this, with the same message; `failures` maps each failed rank to its error's type and first
    line. On a failed rank the original error is the `__cause__`."""

    def __init__(self, message: str, failures: dict[int, dict[str, str]]) -> None:
        self.failures = failures
        super().__init__(message)


class RankLost(ScorerError):
    """A peer rank did not take part in a step's exchange within `timeout_s` (killed, stuck, or
    slower than the bound), or the ranks are out of step. The exchange is broken for good."""


class JobError(ScorerError):
    """One item's call to a job service (enqueue, then pulls) failed. Says where (`service_url`,
    `item_id`, `job_id` once the service gave one), what came back (`status`, a `body` excerpt),
    at which `stage`, and whether remote work may be `orphaned`: the enqueue has no idempotency key
    and the service no cancellation, so an enqueue that may have reached it is never sent again."""

    def __init__(
        self,
        message: str,
        *,
        service_url: str,
        item_id: str,
        stage: Literal["enqueue", "pull"],
        job_id: str | None = None,
        status: int | None = None,
        body: bytes | str = b"",
        orphaned: bool = False,
    ) -> None:
        self.service_url, self.item_id, self.stage, self.job_id = (
            service_url,
            item_id,
            stage,
            job_id,
        )
        self.status, self.orphaned = status, orphaned
        self.body = excerpt(body)
        job = f"job {job_id}" if job_id else "no job id"
        answer = f"; HTTP {status}" if status is not None else ""
        said = f"; body: {self.body!r}" if self.body else ""
        why = (
            "it is never sent again (no idempotency key)"
            if stage == "enqueue"
            else "it may still run (no cancellation)"
        )
        note = f"; remote work may be orphaned: {why}" if orphaned else ""
        ScorerError.__init__(
            self,
            f"job service {service_url}: item {item_id!r} ({job}), {stage}: "
            f"{message}{answer}{said}{note}",
        )


class JobEnqueueUncertain(JobError):
    """The enqueue may have reached the service (a 5xx, a lost connection, no answer in time): it
    may be running there with nobody to pull it. Always `orphaned`."""


class JobServiceUnavailable(JobError):
    """Nothing reached the service (no connection opened), or the backend was closed meanwhile."""


class JobSpoolFailed(JobError):
    """The item's payload could not be written to the spool (a full disk, a file-size limit, the
    spool directory gone): nothing was sent. Or it failed to read back while it was being sent:
    the upload was cut, `orphaned`. `spool_path` is the file (or the directory when no file could
    be made), `errno` the OSError's (ENOSPC, EFBIG, EDQUOT, EIO...)."""

    def __init__(self, message: str, *, spool_path: str, errno: int | None, **where: Any) -> None:
        self.spool_path, self.errno = spool_path, errno
        JobError.__init__(self, message, **where)


class JobRejected(JobError):
    """The service refused the call for good: a 4xx that is not a pending answer (a 401
    included)."""

    kind = "rejected"


class JobProtocolError(JobError):
    """An answer outside the protocol: a 202 for another job, an enqueue answer without a job id, a
    200 that is not exactly one finite score, a job id the service already gave another item (both
    items fail: nobody can tell whose upload that job's score is)."""


class JobDeadline(JobError):
    """The request's absolute deadline passed before this item's score came back; a score arriving
    later is not taken."""


class JobItemsFailed(ScorerItemsFailed):
    """Some items of a request to a job service failed: `errors` maps each to its typed JobError
    (`failed` to its message, `partial` the response for the others, as for any backend)."""

    def __init__(self, message: str, errors: dict[str, JobError], partial: Any) -> None:
        self.errors = dict(errors)
        super().__init__(message, failed={i: str(e) for i, e in errors.items()}, partial=partial)


def excerpt(body: bytes | str, limit: int = 300) -> str:
    """The start of an answer's body, as text, for an error message."""
    text = body if isinstance(body, str) else bytes(body[: limit * 4]).decode("utf-8", "replace")
    return text[:limit] + ("..." if len(text) > limit else "")


class ConfigError(ValueError):
    """A configuration cannot work (e.g. several GPUs for one child)."""


# -- transport facts, raised by the HTTP clients ----------------------------------------------
def validation_message(exc: ValueError) -> str:
    """A pydantic ValidationError (any ValueError) in one line: where, then what, for the first
    error."""
    errors = getattr(exc, "errors", None)
    if not callable(errors) or not errors():
        return str(exc)
    first = errors()[0]
    where = ".".join(map(str, first.get("loc", ())))
    more = f" (and {len(errors()) - 1} more)" if len(errors()) > 1 else ""
    # a validator's own message, as it wrote it
    message = str(first.get("msg", "")).removeprefix("Value error, ")
    return f"{where + ': ' if where else ''}{message}{more}"


class TransportError(Exception):
    """No usable answer came back."""


class ConnectFailed(TransportError):
    """No connection could be opened: nothing was sent. `local` when this process is the one out of
    resources (descriptors, buffers, memory): the server is not to blame."""

    def __init__(self, message: str, local: bool = False) -> None:
        self.local = local
        super().__init__(message)


class NoAnswer(TransportError):
    """The deadline passed before the whole answer arrived."""


class ConnectionLost(TransportError):
    """The server closed or reset the connection mid-exchange."""


class BadAnswer(TransportError):
    """The answer is not the protocol: bad HTTP, a body that is not a frame or JSON."""


class IdentityMismatch(BadAnswer):
    """A /score answer (an error answer too) names another scorer identity than the client expects,
    or a successful one names none (a server older than the identity header)."""

    def __init__(self, url: str, expected: str, got: str | None) -> None:
        self.url, self.expected, self.got = url, expected, got
        if got is None:
            said = (
                f"carries no scorer identity ({IDENTITY_HEADER}): the server is older than "
                f"this client "
                "(version mismatch: run the same managed-scorers release on both sides)"
            )
        else:
            said = f"comes from scorer identity {got}"
        super().__init__(
            f"{url}: the /score answer {said}, not from {expected} as expected; refused"
        )

    def __reduce__(self) -> tuple[type, tuple[str, str, str | None]]:
        return type(self), (self.url, self.expected, self.got)


class ErrorStatus(Exception):
    """The server answered with a non-2xx status: `kind` and `message` from its JSON body."""

    def __init__(self, status: int, kind: str, message: str) -> None:
        self.status = status
        self.kind = kind
        self.message = message
        super().__init__(f"HTTP {status} {kind}: {message}")


# What became of a managed child after a failed exchange (the backend decides; see
# managed._failure).
Fate = Literal["serving", "gone", "died", "killed"]


def _killed_note(exc: Exception) -> str:
    if isinstance(exc, (BadAnswer, RewardContractError)):
        return "child killed, its answers cannot be trusted"
    if isinstance(exc, NoAnswer):
        return "child killed, its state is unknown"
    return "transport failed with the child alive; child killed"


def prefixed(error: BaseException, prefix: str) -> BaseException:
    """`error` as a new exception of the same type and fields (the original stays as it was), its
    message prefixed with who failed (a replica, a server of several): callers classify it as
    before. Anything but a ScorerError is handed back as it is."""
    if not isinstance(error, ScorerError):
        return error
    named = type(error).__new__(type(error))
    named.__dict__.update(error.__dict__)
    named.args = (f"{prefix}: {error.args[0]}", *error.args[1:])
    return named


def scorer_error(
    exc: TransportError | ErrorStatus | RewardContractError,
    what: str,
    record: ChildRecord | None = None,
    fate: Fate | None = None,
) -> ScorerError:
    """The one translation of a failed exchange into the trainer-facing error. `record` is the
    managed child's, `fate` what became of it: left serving (nothing reached it), gone (closed or
    replaced during the call), died, or killed by us; None for a server someone else started."""
    # it answered that it is wedged (wire.RESTART_KINDS)
    if isinstance(exc, ErrorStatus) and fate == "killed":
        text = (
            f"{what}: answered HTTP {exc.status} ({exc.kind}): {exc.message}; child killed, "
            f"restarted next call"
        )
        return (
            ScorerTimeout(text, record) if exc.kind == WEDGED else ScorerProcessDied(text, record)
        )
    if isinstance(exc, ErrorStatus):  # it answered: it keeps serving
        return ScorerRequestError(
            f"{what}: answered HTTP {exc.status} ({exc.kind}): {exc.message}",
            record,
            status=exc.status,
            kind=exc.kind,
        )
    if fate == "serving":
        return ScorerUnavailable(f"{what}: {exc}; the child was left serving", record)
    if fate == "gone":
        return ScorerProcessDied(
            f"{what}: the backend was closed, or the child replaced or failed, during the "
            f"call ({exc})",
            record,
        )
    if fate == "died":
        return ScorerProcessDied(f"child died during {what} ({exc})", record)
    note = _killed_note(exc) if fate == "killed" else ""
    if isinstance(exc, RewardContractError):
        return RewardContractError(f"{str(exc).splitlines()[0]}; {note}", record)
    text = f"{what}: {exc}" + (f"; {note}" if note else "")
    if isinstance(exc, IdentityMismatch):
        return ScorerIdentityChanged(text, record, url=exc.url, expected=exc.expected, got=exc.got)
    if isinstance(exc, BadAnswer):
        return RewardContractError(text, record)
    if isinstance(exc, NoAnswer):
        return ScorerTimeout(text, record)
    if record is None:
        return ScorerUnavailable(text)
    return ScorerProcessDied(text, record)
