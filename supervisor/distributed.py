"""Scoring across trainer ranks: each rank scores its own shard with its own children, and the
ranks agree on every step's outcome in a bounded exchange of scalars.

Why: under torchrun every rank scores what it generated. Without an agreement, a rank whose
required term fails raises while the others walk into the trainer's next collective and wait
there for the backend's default timeout (30 minutes for gloo and NCCL). And a groupwise scorer
would see only the part of a group that one rank generated (TRL spreads a prompt's
completions over ranks).

`DistributedRewards` wraps any backend (managed, local, remote, a panel). Each call is a
collective: every rank calls it once per step, in the same order, as trainers call their reward
functions. It talks over a gloo group of its own whose `timeout_s` bounds every wait here.
What travels are JSON documents as byte tensors (never pickles, never media): ids, group ids and
rewards, plus, for a group that spans ranks, the fields its scorer declares it reads.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from scorers.diagnostics import merge_term_reports
from scorers.groups import COMMON_INPUTS
from supervisor.backend import RewardBackend, ScorerShape
from supervisor.errors import ConfigError, RewardContractError, ScorerError, ScorerRequestError
from supervisor.joined import join_rows, rows_by_id
from supervisor.segment import HeapArena, SharedArena
from supervisor.types import RewardItem, RewardRequest, RewardResponse

# What a rebuilt item may carry: a group spanning ranks travels as JSON, so media cannot.
JSON_FIELDS = ("prompt", "text", "reference", "metadata", "finish_reason", "completion_tokens", "data_source")
DEFAULT_TIMEOUT_S = 300.0


class RankFailed(ScorerError):
    """The step failed on one or more ranks. Every rank raises this, with the same message.

    `failures` maps each failed rank to the type and first line of its error; on the failed
    rank itself the original error is the `__cause__`."""

    def __init__(self, message: str, failures: dict[int, dict[str, str]]) -> None:
        self.failures = failures
        super().__init__(message)


class RankLost(ScorerError):
    """A peer rank did not take part in the exchange within `timeout_s` (killed, stuck, or gone).
    The group is broken: this backend refuses every later call with the same error."""


def _shapes(backend: RewardBackend) -> list[ScorerShape | None]:
    terms = getattr(backend, "terms", None)  # a panel: each term's scorer scores what we hand it
    if terms is not None:
        return [term.backend.shape for term in terms]
    return [backend.shape]


def _describe(exc: BaseException) -> dict[str, str]:
    first = str(exc).splitlines()[0] if str(exc) else ""
    return {"type": type(exc).__name__, "message": first}


class DistributedRewards(RewardBackend):
    """`backend` on every rank, scored as one step: a failure anywhere raises everywhere.

    `compute_rewards(request)` takes this rank's items and returns their rewards;
    `world_response` then holds every rank's, in rank order (the same on every rank).
    torch.distributed must be initialised (torchrun's env://, or Ray/Slurm setting the same
    variables); constructing this is itself a collective (a new gloo group).
    """

    def __init__(self, backend: RewardBackend, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        import torch.distributed as dist

        if not dist.is_available() or not dist.is_initialized():
            raise ConfigError(
                "DistributedRewards needs torch.distributed initialised (torchrun, or init_process_group)"
            )
        if not timeout_s > 0:
            raise ConfigError(f"timeout_s must be > 0, got {timeout_s!r}")
        self.backend = backend
        self.timeout_s = float(timeout_s)
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        self._dist = dist
        self._group = dist.new_group(backend="gloo", timeout=timedelta(seconds=self.timeout_s))
        self._broken: RankLost | None = None
        self._local_error: Exception | None = None  # this rank's own failure in the step being exchanged
        self.world_response: RewardResponse | None = None
        self.exchanged_bytes = 0  # what this rank received in exchanges, all calls together

    @property
    def shape(self) -> ScorerShape | None:  # type: ignore[override]  # the wrapped backend's
        return self.backend.shape

    @property
    def identity_hash(self) -> str | None:
        return self.backend.identity_hash

    # -- the exchange ----------------------------------------------------------------------
    def _all_gather(self, what: str, document: Any) -> list[Any]:
        """Every rank's `document`, in rank order; RankLost when a peer does not answer in time."""
        if self._broken is not None:
            raise self._broken
        import torch

        payload = json.dumps(document, separators=(",", ":"), allow_nan=False).encode()
        try:
            size = torch.tensor([len(payload)], dtype=torch.int64)
            sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(self.world_size)]
            self._dist.all_gather(sizes, size, group=self._group)
            longest = max(int(s.item()) for s in sizes)
            mine = torch.zeros(longest, dtype=torch.uint8)
            if payload:
                mine[: len(payload)] = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
            buffers = [torch.empty(longest, dtype=torch.uint8) for _ in range(self.world_size)]
            self._dist.all_gather(buffers, mine, group=self._group)
        except RuntimeError as exc:  # gloo: a peer closed its connection, or the group's timeout passed
            self._broken = RankLost(
                f"rank {self.rank}: the {what} exchange of {self.world_size} ranks failed within "
                f"timeout_s={self.timeout_s:g}: a peer rank was killed, is stuck, or left ({str(exc).splitlines()[0]}); "
                "this group is broken for good"
            )
            raise self._broken from exc
        self.exchanged_bytes += sum(int(s.item()) for s in sizes)
        return [json.loads(bytes(b[: int(s.item())].numpy())) for b, s in zip(buffers, sizes, strict=True)]

    # -- a step ----------------------------------------------------------------------------
    def compute_rewards(self, request: RewardRequest) -> RewardResponse:
        shapes = _shapes(self.backend)
        groupwise = any(s is not None and s.groupwise for s in shapes)
        members = [[item.id, item.group_id] for item in request.items]
        if not groupwise:  # one exchange: score the shard, then share members and results together
            outcome = self._score(request.items, None)
            answers = self._all_gather("results", {"members": members, "group_size": request.group_size, **outcome})
            layout = self._layout([a["members"] for a in answers], [a["group_size"] for a in answers], shapes)
            return self._finish(request, answers, layout, outcome)
        gathered = self._all_gather("membership", {"members": members, "group_size": request.group_size})
        layout = self._layout([g["members"] for g in gathered], [g["group_size"] for g in gathered], shapes)
        spanning: dict[str, int] = layout["spanning"]
        rebuilt: dict[str, RewardItem] = {}
        if spanning:  # the same on every rank: all take part in this exchange or none does
            fields = self._fields(shapes)
            mine = [self._portable(item, fields) for item in request.items if item.group_id in spanning]
            for rank, documents in enumerate(self._all_gather("group fields", mine)):
                if rank != self.rank:
                    for document in documents:
                        rebuilt[document["id"]] = RewardItem.model_validate(document)
        own = {item.id: item for item in request.items}
        to_score = []
        for item_id, group_id, _rank in layout["order"]:  # global order: a group's members as one process sees them
            if group_id in spanning:
                if spanning[group_id] == self.rank:
                    to_score.append(own[item_id] if item_id in own else rebuilt[item_id])
            elif item_id in own:
                to_score.append(own[item_id])
        outcome = self._score(to_score, request.group_size)
        answers = self._all_gather("results", outcome)
        return self._finish(request, answers, layout, outcome)

    def _score(self, items: Sequence[RewardItem], group_size: int | None) -> dict[str, Any]:
        """Score `items` here; any error is reported to the other ranks, never raised before the exchange."""
        if not items:
            return {"ok": True, "response": None}
        try:
            response = self.backend.compute_rewards(RewardRequest(items=list(items), group_size=group_size))
            document = json.loads(response.model_dump_json())  # plain JSON: what the exchange can carry
        except Exception as exc:  # noqa: BLE001 - every rank raises it, after the exchange
            self._local_error = exc
            return {"ok": False, "error": _describe(exc)}
        return {"ok": True, "response": document}

    def _layout(
        self, members: list[list[list[Any]]], group_sizes: list[int | None], shapes: list[ScorerShape | None]
    ) -> dict[str, Any]:
        """Who has which item, and which groups span ranks (each is scored by the lowest rank holding it).
        Computed from the exchange alone, so every rank reaches the same verdict and raises the same error."""
        if len(set(group_sizes)) > 1:
            raise ScorerRequestError(f"ranks declare different group sizes: {group_sizes}", kind="bad_input")
        group_size = group_sizes[0]
        owner: dict[str, int] = {}
        order: list[tuple[str, str | None, int]] = []
        counts: dict[str, int] = {}
        ranks_of: dict[str, set[int]] = {}
        for rank, items in enumerate(members):
            for item_id, group_id in items:
                if item_id in owner:
                    raise ScorerRequestError(
                        f"item id {item_id!r} is on rank {owner[item_id]} and rank {rank}: ids must be unique "
                        "across ranks, so that every reward reaches its own sample",
                        kind="bad_input",
                    )
                owner[item_id] = rank
                order.append((item_id, group_id, rank))
                if group_id is not None:
                    counts[group_id] = counts.get(group_id, 0) + 1
                    ranks_of.setdefault(group_id, set()).add(rank)
        ragged = any(s is not None and s.groupwise and s.ragged_groups for s in shapes)
        if group_size is not None and not ragged:
            for group_id, count in counts.items():
                if count != group_size:
                    raise ScorerRequestError(
                        f"group {group_id!r} has {count} items over ranks {sorted(ranks_of[group_id])}, expected "
                        f"group_size {group_size}: incomplete groups are never scored",
                        kind="bad_input",
                    )
        spanning = {g: min(r) for g, r in ranks_of.items() if len(r) > 1}
        return {"owner": owner, "order": order, "spanning": spanning}

    @staticmethod
    def _fields(shapes: list[ScorerShape | None]) -> tuple[str, ...]:
        """The fields a rebuilt item carries: what every scorer declares it reads, and the group's common inputs."""
        declared: set[str] = set()
        for shape in shapes:
            if shape is None or not shape.required_fields:
                return JSON_FIELDS  # a scorer that declares nothing gets everything that can travel
            declared.update(shape.required_fields)
        media = sorted(declared - set(JSON_FIELDS))
        if media:
            raise ConfigError(
                f"groups span ranks, but the scorers read {media}, which do not travel between ranks: keep each "
                "group's candidates on one rank"
            )
        return tuple(f for f in JSON_FIELDS if f in declared or f in COMMON_INPUTS)

    @staticmethod
    def _portable(item: RewardItem, fields: tuple[str, ...]) -> dict[str, Any]:
        document: dict[str, Any] = {"id": item.id, "group_id": item.group_id}
        for name in fields:
            value = getattr(item, name)
            if value is not None and value != {}:
                document[name] = value
        return document

    def _finish(
        self, request: RewardRequest, answers: list[dict[str, Any]], layout: dict[str, Any], outcome: dict[str, Any]
    ) -> RewardResponse:
        failed = {rank: answer["error"] for rank, answer in enumerate(answers) if not answer["ok"]}
        if failed:
            lines = "; ".join(f"rank {r}: {e['type']}: {e['message']}" for r, e in sorted(failed.items()))
            error = RankFailed(f"reward step failed on rank(s) {sorted(failed)} of {self.world_size}: {lines}", failed)
            cause, self._local_error = self._local_error, None
            raise error from cause
        responses = [RewardResponse.model_validate(a["response"]) for a in answers if a["response"] is not None]
        rows = rows_by_id(responses)
        world_ids = [item_id for item_id, _group, _rank in layout["order"]]
        missing = [item_id for item_id in world_ids if item_id not in rows]
        if missing:
            raise RewardContractError(f"no reward came back for ids {missing[:8]} (of {len(missing)})")
        self.world_response = join_rows(world_ids, rows, merge_term_reports(r.diagnostics for r in responses))
        mine = RewardResponse.model_validate(outcome["response"]) if outcome["response"] is not None else None
        return join_rows(request.ids, rows, mine.diagnostics if mine is not None else {})

    # -- the rest of the backend interface goes to the wrapped backend ------------------------
    def onload(self) -> dict[str, Any]:
        return self.backend.onload()

    def offload(self) -> dict[str, Any]:
        return self.backend.offload()

    def drain(self) -> dict[str, Any]:
        return self.backend.drain()

    def arena(self) -> SharedArena | HeapArena:
        return self.backend.arena()

    def interrupt(self) -> None:
        self.backend.interrupt()

    def _check_owner(self) -> None:
        self.backend._check_owner()

    def close(self) -> None:
        """Closes the wrapped backend (the gloo group goes with the trainer's process group)."""
        self._stop_submissions()
        self.backend.close()
