"""Scoring across trainer ranks: each rank scores its own shard with its own children, and the
ranks agree on every step's outcome in bounded exchanges of JSON.

Why: under torchrun every rank scores what it generated. Without an agreement, a rank whose
required term fails raises while the others walk into the trainer's next collective and wait
there for the backend's default timeout (30 minutes for gloo and NCCL). And a group whose
candidates were generated on several ranks (TRL and flow_grpo spread a prompt's samples over
ranks) would be judged, checked or failed piecemeal.

`DistributedRewards` wraps any backend (managed, local, remote, replicated, a panel). Each call
is a collective: every rank calls it once per step, in the same order, as trainers call their
reward functions (a rank with nothing to score passes None; one that cannot build its request
calls `fail_step`). A step is two or three exchanges over a gloo group of its own, each bounded
by `timeout_s`: members (ids, group ids), then, when a group spans ranks and must be scored
whole, the fields of its candidates, then results. Every document carries the call number,
the phase and the backend's signature, so ranks out of step are caught, never mixed. What
travels are JSON documents as byte tensors, never pickles; the media of a spanning group's
candidates, when it has any, follow the fields as raw bytes in one more gather (`rank_media`) and
are rebuilt in the scoring backend's arena (a child's shared segment).
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any, NoReturn

from child_runtime.protocol.items import MEDIA_FIELDS, WIRE_FIELDS
from scorers.diagnostics import merge_term_reports
from scorers.identity import digest
from supervisor.arena import Arena
from supervisor.backend import RewardBackend
from supervisor.compose import rank_media
from supervisor.composition import Wrapper, component
from supervisor.errors import (
    ConfigError,
    GroupsIncomplete,
    RankFailed,
    RankLost,
    RewardContractError,
    ScorerRequestError,
)
from supervisor.joined import join_rows, rows_by_id
from supervisor.outcome import Outcome
from supervisor.shape import ScorerShape
from supervisor.types import RewardItem, RewardRequest, RewardResponse

log = logging.getLogger(__name__)
# What a rebuilt item carries as JSON: every wire field but its media (`rank_media` ships those).
JSON_FIELDS = tuple(name for name in WIRE_FIELDS if name not in MEDIA_FIELDS)
# over the slowest call a backend allows (boot plus one request), for the default bound
MARGIN_S = 60.0
FALLBACK_TIMEOUT_S = 600.0  # when no backend states its deadlines


def _describe(exc: BaseException) -> dict[str, str]:
    text = str(exc)
    return {"type": type(exc).__name__, "message": text.splitlines()[0] if text else ""}


class DistributedRewards(Wrapper):
    """`backend` on every rank, scored as one step: a failure anywhere raises everywhere.

    `compute_rewards(request)` takes this rank's items (None: none this step) and returns
    theirs; `compute_world_rewards` also returns every rank's, in rank order (the same on every
    rank). A group whose candidates are on several ranks is scored whole on one of them when the
    scoring needs whole groups (`needs_whole_groups`), else where each candidate is. Calls are
    serialised. torch.distributed must be initialised; constructing this is a collective too
    (a new gloo group). `timeout_s` bounds every wait on a peer; the default is the slowest call
    the backend's own deadlines allow plus a minute: it must exceed the spread between the ranks'
    arrivals (generation) plus their scoring.
    """

    def __init__(self, backend: RewardBackend, *, timeout_s: float | None = None) -> None:
        import torch.distributed as dist

        if not dist.is_available() or not dist.is_initialized():
            raise ConfigError(
                "DistributedRewards needs torch.distributed initialised (torchrun, or "
                "init_process_group)"
            )
        slowest = component(backend).call_bound_s
        if timeout_s is None:
            timeout_s = slowest + MARGIN_S if slowest is not None else FALLBACK_TIMEOUT_S
        elif not timeout_s > 0:
            raise ConfigError(f"timeout_s must be > 0, got {timeout_s!r}")
        elif slowest is not None and timeout_s < slowest:
            log.warning(
                "DistributedRewards timeout_s=%g is below the %g s one call may take by the "
                "backend's deadlines: a slow (not stuck) rank will break the exchange",
                timeout_s,
                slowest,
            )
        self.backend = backend
        self.timeout_s = float(timeout_s)
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        self._dist = dist
        self._group = dist.new_group(backend="gloo", timeout=timedelta(seconds=self.timeout_s))
        self._lock = threading.Lock()
        self._calls = 0
        self._trainer_step: int | None = None
        self._broken: RankLost | None = None
        self._whole_groups = component(backend).needs_whole_groups()
        # pointwise scoring: a spanning group's candidates are scored where they are (WFM: one
        # trajectory per rank, media that never travel), its size checked over the world
        self._apart = not component(backend).needs_whole_groups(sizes_checked=True)
        leaves = component(backend).leaves()
        self._signature = digest(
            [self._whole_groups, [repr(component(leaf).shape) for leaf in leaves]]
        )[:16]
        # the last successful call's, every rank's
        self.world_response: RewardResponse | None = None
        self.exchanged_bytes = 0  # what this rank received in exchanges, all calls together

    @property
    def shape(self) -> ScorerShape | None:  # type: ignore[override]  # the wrapped backend's
        return component(self.backend).shape

    @property
    def identity_hash(self) -> str | None:
        return component(self.backend).identity_hash

    def members(self) -> list[RewardBackend]:
        return [self.backend]

    @property
    def scoring_world(self) -> tuple[int, int]:
        return (self.rank, self.world_size)

    # -- the calls -------------------------------------------------------------------------
    def score(self, request: RewardRequest) -> Outcome:
        """This rank's rewards; `request.step` (the trainer's step) is checked against the other
        ranks'. A failure is every rank's, raised (a collective: see `_step`)."""
        return Outcome.scored(self.compute_world_rewards(request)[0])

    async def compute_rewards_async(self, request: RewardRequest) -> RewardResponse:
        """In a thread of its own, outside the submission queue: a step is a collective that every
        rank must finish, so a cancelled coroutine neither drops it while queued nor interrupts it
        midway (the thread completes the step; nobody reads its answer)."""
        return await asyncio.to_thread(self.compute_rewards, request)

    def compute_world_rewards(
        self, request: RewardRequest | None, step: int | None = None
    ) -> tuple[RewardResponse, RewardResponse]:
        """(this rank's response, every rank's response in rank order); None: this rank has nothing
        to score this step, but takes part. The trainer's step (`step`, else `request.step`) is
        checked against the other ranks': a rank that skipped a call is caught at its next one
        (without it, only when the call counts diverge)."""
        if request is None:
            return self._step([], None, None, step)
        return self._step(
            list(request.items), request.group_size, None, request.step if step is None else step
        )

    def fail_step(self, error: Exception, step: int | None = None) -> NoReturn:
        """Take part in this step while failing it (this rank could not build its request): every
        rank raises the same RankFailed, as if its scoring had failed, and stays in step."""
        self._step([], None, error, step)
        raise AssertionError("unreachable: a failed step always raises")

    def _step(
        self,
        items: list[RewardItem],
        group_size: int | None,
        failure: Exception | None,
        step: int | None,
    ) -> tuple[RewardResponse, RewardResponse]:
        with self._lock:
            self._calls += 1
            self._trainer_step = step
            self.world_response = None
            members = [[item.id, item.group_id, item.has_media] for item in items]
            gathered = self._exchange(
                "members",
                {
                    "members": members,
                    "group_size": group_size,
                    "failed": _describe(failure) if failure else None,
                },
            )
            failed = {
                rank: g["failed"] for rank, g in enumerate(gathered) if g["failed"] is not None
            }
            if failed:
                raise self._rank_failed(failed, failure)
            layout = _layout(gathered)
            rebuild = (
                layout.spanning
                and not self._apart
                and (self._whole_groups or layout.group_size is not None)
            )
            if rebuild:
                shipped, blobs = self._ship(items, layout, gathered)
                with self.backend.arena() as arena:  # a child's shared segment, where it has one
                    outcome = self._score(
                        lambda: self._assigned(items, layout, shipped, (blobs, arena)), group_size
                    )
            else:
                outcome = self._score(lambda: items, group_size, _elsewhere(items, layout))
            answers = self._exchange("results", outcome)
            local_error = outcome.pop("_error", None)
            return self._finish([item.id for item in items], answers, layout, local_error)

    def _ship(
        self, items: list[RewardItem], layout: _Layout, gathered: list[dict[str, Any]]
    ) -> tuple[list[dict[str, Any]], list[Any]]:
        """The spanning groups' items, to the ranks that score them: their fields as JSON with a
        manifest of their arrays, then (only when any rank has media there) every rank's arrays
        as one raw byte buffer (`rank_media`), never JSON."""
        documents: list[dict[str, Any]] = []
        arrays: list[Any] = []
        offset = 0
        for item in items:
            owner = layout.spanning.get(item.group_id)  # type: ignore[arg-type]
            if owner is not None and owner != self.rank:
                document = self._portable(item)
                document["media"], offset = rank_media.manifest(item, arrays, offset)
                documents.append(document)
        shipped = self._exchange("fields", {"items": documents})
        media = any(m[2] for g in gathered for m in g["members"] if m[1] in layout.spanning)
        if not media:  # the same on every rank: it comes from the members exchange
            return shipped, [None] * self.world_size
        return shipped, self._gather_raw("media", rank_media.buffer(arrays))

    def _assigned(
        self,
        items: list[RewardItem],
        layout: _Layout,
        shipped: list[dict[str, Any]],
        media: tuple[list[Any], Arena],
    ) -> list[RewardItem]:
        """What this rank scores: its groups that stay on it, and the spanning groups it owns,
        whole (their media rebuilt from the buffers in the arena)."""
        blobs, arena = media
        own = {item.id: item for item in items}
        rebuilt = {}
        for rank, document in enumerate(shipped):
            if rank != self.rank:
                for fields in document["items"]:
                    if layout.spanning.get(fields.get("group_id")) == self.rank:
                        described = fields.pop("media")
                        if described:
                            fields.update(rank_media.rebuilt(described, blobs[rank], arena, rank))
                        rebuilt[fields["id"]] = RewardItem.model_validate(fields)
        chosen = []
        # global order: a group's members as one process sees them
        for item_id, group_id, _rank in layout.order:
            if group_id in layout.spanning:
                if layout.spanning[group_id] == self.rank:
                    chosen.append(own[item_id] if item_id in own else rebuilt[item_id])
            elif item_id in own:
                chosen.append(own[item_id])
        return chosen

    @staticmethod
    def _portable(item: RewardItem) -> dict[str, Any]:
        document = {name: value for name, value in item.to_wire().items() if name in JSON_FIELDS}
        document.setdefault("group_id", None)
        return document

    def _score(
        self,
        build: Callable[[], Sequence[RewardItem]],
        group_size: int | None,
        elsewhere: dict[str, int] | None = None,
    ) -> dict[str, Any]:
        """Score what `build` gives; any error is reported to the other ranks, never raised before
        the exchange."""
        try:
            items = list(build())
            if not items:
                return {"ok": True, "response": None}
            response = self.backend.compute_rewards(
                RewardRequest(
                    items=items,
                    group_size=group_size,
                    step=self._trainer_step,
                    groups_elsewhere=elsewhere or {},
                )
            )
            # plain JSON: what the exchange can carry
            document = json.loads(response.model_dump_json())
        except Exception as exc:  # noqa: BLE001 - every rank raises it, after the exchange
            return {"ok": False, "error": _describe(exc), "_error": exc}
        return {"ok": True, "response": document}

    # -- the exchange ----------------------------------------------------------------------
    def _exchange(self, phase: str, document: dict[str, Any]) -> list[dict[str, Any]]:
        """Every rank's `document` for this phase of this call, in rank order. RankLost when a peer
        does not answer within timeout_s, or answers for another call or phase."""
        if self._broken is not None:
            raise self._broken
        gathered = self._gather(phase, self._payload(phase, document))
        self._check_in_step(gathered)
        return gathered

    def _payload(self, phase: str, document: dict[str, Any]) -> bytes:
        """This rank's document as JSON, stamped with what every rank must share: the call, the
        step, the phase and the backend's signature (`_`-keys stay on this rank)."""
        stamped = {k: v for k, v in document.items() if not k.startswith("_")}
        stamped.update(
            {
                "call": self._calls,
                "step": self._trainer_step,
                "phase": phase,
                "signature": self._signature,
            }
        )
        return json.dumps(
            stamped, separators=(",", ":"), allow_nan=False, ensure_ascii=False
        ).encode()

    def _gather(self, phase: str, payload: bytes) -> list[dict[str, Any]]:
        """Every rank's payload, decoded, in rank order; RankLost, for good, when the collective
        fails."""
        return [json.loads(bytes(buffer)) for buffer in self._gather_raw(phase, payload)]

    def _gather_raw(self, phase: str, payload: bytes) -> list[Any]:
        """Every rank's payload as a uint8 NumPy array, in rank order (sizes first: the buffers
        are padded to the longest); RankLost, for good, when the collective fails."""
        import torch

        try:
            size = torch.tensor([len(payload)], dtype=torch.int64)
            sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(self.world_size)]
            self._dist.all_gather(sizes, size, group=self._group)
            longest = max(1, *(int(s.item()) for s in sizes))  # a media buffer may be empty
            mine = torch.zeros(longest, dtype=torch.uint8)
            if payload:
                mine[: len(payload)] = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
            buffers = [torch.empty(longest, dtype=torch.uint8) for _ in range(self.world_size)]
            self._dist.all_gather(buffers, mine, group=self._group)
        # gloo: a peer closed its connection, or the group's timeout passed
        except RuntimeError as exc:
            self._broken = RankLost(
                f"rank {self.rank}: the {phase} exchange of call {self._calls} "
                f"({self.world_size} ranks) failed within timeout_s={self.timeout_s:g}: a "
                f"peer rank was killed, is stuck, or is slower than the bound "
                f"({str(exc).splitlines()[0]}); this exchange is broken for good"
            )
            raise self._broken from exc
        self.exchanged_bytes += sum(int(s.item()) for s in sizes)
        return [b[: int(s.item())].numpy() for b, s in zip(buffers, sizes, strict=True)]

    def _check_in_step(self, gathered: list[dict[str, Any]]) -> None:
        """RankLost, for good, when the ranks are not at the same call, step and phase, or wrap
        different backends."""
        seen = {(g["call"], g["phase"], g["signature"]) for g in gathered}
        steps = {g["step"] for g in gathered if g["step"] is not None}
        if len(seen) > 1 or len(steps) > 1:
            where = "; ".join(
                f"rank {r}: call {g['call']} step {g['step']} {g['phase']}"
                for r, g in enumerate(gathered)
            )
            self._broken = RankLost(
                f"ranks are out of step ({where}; backend signatures "
                f"{sorted({g['signature'] for g in gathered})}): a rank skipped a call (call "
                f"fail_step instead), "
                "or the ranks wrap different backends; this exchange is broken for good"
            )
            raise self._broken

    def _rank_failed(
        self, failed: dict[int, dict[str, str]], cause: BaseException | None
    ) -> RankFailed:
        lines = "; ".join(
            f"rank {r}: {e['type']}: {e['message']}" for r, e in sorted(failed.items())
        )
        error = RankFailed(
            f"reward step failed on rank(s) {sorted(failed)} of {self.world_size}: {lines}", failed
        )
        error.__cause__ = cause
        return error

    def _finish(
        self,
        my_ids: list[str],
        answers: list[dict[str, Any]],
        layout: _Layout,
        local_error: Exception | None,
    ) -> tuple[RewardResponse, RewardResponse]:
        failed = {rank: answer["error"] for rank, answer in enumerate(answers) if not answer["ok"]}
        if failed:
            raise self._rank_failed(failed, local_error)
        responses = [
            RewardResponse.model_validate(a["response"])
            for a in answers
            if a["response"] is not None
        ]
        rows = rows_by_id(responses)
        world_ids = [item_id for item_id, _group, _rank in layout.order]
        missing = [item_id for item_id in world_ids if item_id not in rows]
        if missing:
            raise RewardContractError(
                f"no reward came back for ids {missing[:8]} (of {len(missing)})"
            )
        try:
            diagnostics = merge_term_reports(r.diagnostics for r in responses)
        # the same data on every rank: the same error
        except (TypeError, ValueError, KeyError) as exc:
            raise RewardContractError(f"the ranks' diagnostics cannot be merged: {exc!r}") from exc
        world = join_rows(world_ids, rows, diagnostics) if world_ids else _empty()
        mine_scored = answers[self.rank]["response"]
        mine = (
            join_rows(my_ids, rows, mine_scored["diagnostics"] if mine_scored else {})
            if my_ids
            else _empty()
        )
        self.world_response = world
        return mine, world

    def close(self) -> None:
        """Closes the wrapped backend (the gloo group goes with the trainer's process group)."""
        self._stop_submissions()
        self.backend.close()


def _empty() -> RewardResponse:
    return RewardResponse(ids=[], rewards=[], component_rewards={})


class _Layout:
    """Who has which item, and which groups span ranks, from the members exchange alone: every rank
    computes the same, so a refusal here is raised by every rank alike."""

    def __init__(
        self,
        order: list[tuple[str, str | None, int]],
        spanning: dict[str, int],
        group_size: int | None,
    ):
        self.order = order
        self.spanning = spanning  # group id -> the rank that scores it whole
        self.group_size = group_size


def _elsewhere(items: list[RewardItem], layout: _Layout) -> dict[str, int]:
    """Group id -> its candidates on other ranks, for this rank's groups that span ranks and are
    scored where each candidate is: their size is checked over the world (RewardRequest)."""
    world: dict[str, int] = {}
    for _item_id, group_id, _rank in layout.order:
        if group_id in layout.spanning:
            world[group_id] = world.get(group_id, 0) + 1
    here: dict[str, int] = {}
    for item in items:
        if item.group_id in layout.spanning:
            here[item.group_id] = here.get(item.group_id, 0) + 1
    return {group_id: world[group_id] - count for group_id, count in here.items()}


def _check_world_sizes(
    group_size: int, counts: dict[str, int], ranks_of: dict[str, list[int]]
) -> None:
    """GroupsIncomplete, on every rank alike, naming each group not of the declared size."""
    wrong = {group_id: count for group_id, count in counts.items() if count != group_size}
    if wrong:
        listed = "; ".join(
            f"group {group_id!r} has {count} items over ranks {ranks_of[group_id]}, expected "
            f"group_size {group_size}"
            for group_id, count in wrong.items()
        )
        raise GroupsIncomplete(
            f"{listed}: incomplete groups are never scored (group ids {list(wrong)[:8]})",
            group_size,
            wrong,
        )


def _layout(gathered: list[dict[str, Any]]) -> _Layout:
    sizes = {g["group_size"] for g in gathered if g["members"]}
    if len(sizes) > 1:
        raise ScorerRequestError(
            f"ranks declare different group sizes: {sorted(sizes, key=str)}", kind="bad_input"
        )
    group_size = sizes.pop() if sizes else None
    holder: dict[str, int] = {}
    order: list[tuple[str, str | None, int]] = []
    counts: dict[str, int] = {}
    ranks_of: dict[str, list[int]] = {}
    for rank, document in enumerate(gathered):
        for item_id, group_id, _media in document["members"]:
            if item_id in holder:
                raise ScorerRequestError(
                    f"item id {item_id!r} is on rank {holder[item_id]} and rank {rank}: ids "
                    f"must be unique across "
                    "ranks, so that every reward reaches its own sample",
                    kind="bad_input",
                )
            holder[item_id] = rank
            order.append((item_id, group_id, rank))
            if group_id is not None:
                counts[group_id] = counts.get(group_id, 0) + 1
                held = ranks_of.setdefault(group_id, [])
                if rank not in held:
                    held.append(rank)
    if group_size is not None:
        _check_world_sizes(group_size, counts, ranks_of)
    spanning_groups = [g for g, held in ranks_of.items() if len(held) > 1]
    # each spanning group is scored by one of its ranks, in turn, so no rank scores them all
    spanning = {g: ranks_of[g][n % len(ranks_of[g])] for n, g in enumerate(spanning_groups)}
    return _Layout(order, spanning, group_size)
