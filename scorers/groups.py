"""Groups: which candidates are scored together, checked before any scorer code runs.

A group is the items that share a `group_id`. The checks here run on both sides of the
wire (the parent before it cuts chunks, the child before the scorer sees a batch), on
anything with `id`, `group_id`, `prompt` and `reference`, so they cannot drift apart.
Stdlib only, like the rest of the scorer contract.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Protocol

COMMON_INPUTS = ("prompt", "reference", "data_source")


class GroupInputError(ValueError):
    """A request's items do not form the groups the scorer needs (answered 422, never scored)."""


class Grouped(Protocol):
    """What grouping reads of an item (a trainer's RewardItem or a scorer's ScoreItem)."""

    @property
    def id(self) -> str: ...

    @property
    def group_id(self) -> str | None: ...

    @property
    def prompt(self) -> str | None: ...

    @property
    def reference(self) -> Any: ...

    @property
    def data_source(self) -> str | None: ...


def freeze(value: Any) -> Any:
    """Deeply read-only: mappings become mapping proxies, sequences tuples."""
    if isinstance(value, Mapping):
        return MappingProxyType({key: freeze(item) for key, item in value.items()})
    if isinstance(value, (list, tuple)):
        return tuple(freeze(item) for item in value)
    return value


def strict_key(value: Any) -> Any:
    """A structural, type-strict key: JSON 1, true and 1.0 (and "1") all differ."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bool):
        return ("bool", value)
    if isinstance(value, int):
        return ("int", value)
    if isinstance(value, float):
        return ("float", value.hex())
    if isinstance(value, Mapping):
        return ("map", tuple(sorted((str(k), strict_key(v)) for k, v in value.items())))
    if isinstance(value, (list, tuple)):
        return ("seq", tuple(strict_key(item) for item in value))
    return (type(value).__name__, repr(value))


@dataclass(frozen=True)
class GroupContext:
    """What every candidate of a group shares, deeply frozen (make a private copy to mutate)."""

    group_id: str | None
    size: int
    prompt: str | None
    reference: Any


def check_ids(items: Sequence[Grouped]) -> None:
    seen: dict[str, int] = {}
    for index, item in enumerate(items):
        if not isinstance(item.id, str) or not item.id:
            raise GroupInputError(f"items[{index}] has no id (a non-empty string is required)")
        if item.id in seen:
            raise GroupInputError(
                f"items[{index}].id {item.id!r} duplicates items[{seen[item.id]}].id"
            )
        seen[item.id] = index


class IncompleteGroups(GroupInputError):
    """Groups of a declared size were asked for and some are not complete: refused whole, before
    any scorer runs. `counts`: each incomplete group's id -> how many candidates it has."""

    def __init__(
        self, group_size: int, counts: Mapping[str, int], ids: Mapping[str, list[str]]
    ) -> None:
        self.group_size, self.counts = group_size, dict(counts)
        listed = "; ".join(
            f"group {group_id!r} has {count} items, expected group_size {group_size} "
            f"(ids {ids[group_id][:8]})"
            for group_id, count in counts.items()
        )
        super().__init__(
            f"{listed}: incomplete groups are never scored (group ids {list(counts)[:8]}, "
            f"{len(counts)} of them)"
        )


def partition(
    items: Sequence[Grouped],
    group_size: int | None,
    *,
    scorer: str,
    groupwise: bool = False,
    ragged: bool = False,
    elsewhere: Mapping[str, int] | None = None,
) -> list[list[int]]:
    """Item positions by group, in order of first appearance; an ungrouped item is its own group.

    Refuses, naming the id or group: duplicate or missing ids; a group whose size is not a
    declared `group_size` (whatever the scorer, pointwise and ragged ones included: `ragged` only
    lets a groupwise scorer go without a declared size); an item without a group for a scorer that
    needs groups; candidates whose common inputs differ. `elsewhere`: group id -> its candidates
    scored by other ranks in this step (DistributedRewards), counted toward its size.
    """
    check_ids(items)
    _check_group_size(group_size, scorer=scorer, groupwise=groupwise, ragged=ragged)
    order = _by_group_id(items, group_size, scorer)
    counts: dict[str, int] = {}
    ids: dict[str, list[str]] = {}
    for members in order:
        group_id = items[members[0]].group_id
        if group_id is None:
            continue
        count = len(members) + (elsewhere or {}).get(group_id, 0)
        if group_size is not None and count != group_size:
            counts[group_id], ids[group_id] = count, [items[i].id for i in members]
        _check_common_inputs(items, members, group_id)
    if counts and group_size is not None:
        raise IncompleteGroups(group_size, counts, ids)
    return order


def _check_group_size(
    group_size: int | None, *, scorer: str, groupwise: bool, ragged: bool
) -> None:
    """A declared group size is a positive int; a scorer of complete groups needs one declared."""
    if group_size is not None and (
        isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1
    ):
        raise GroupInputError(f"group_size must be a positive int, got {group_size!r}")
    if groupwise and not ragged and group_size is None:
        raise GroupInputError(
            f"scorer {scorer!r} scores complete groups: declare group_size in the request or "
            f"the config"
        )


def _by_group_id(
    items: Sequence[Grouped], checked_size: int | None, scorer: str
) -> list[list[int]]:
    """Positions by group_id, in order of first appearance; `checked_size`: groups of that size are
    declared, so an item without a group_id is refused rather than scored on its own."""
    groups: dict[str, list[int]] = {}
    order: list[list[int]] = []
    for index, item in enumerate(items):
        if item.group_id is None:
            if checked_size is not None:
                raise GroupInputError(
                    f"item {item.id!r} has no group_id, but groups of {checked_size} are "
                    f"declared for scorer {scorer!r}"
                )
            order.append([index])
            continue
        members = groups.get(item.group_id)
        if members is None:
            members = groups[item.group_id] = []
            order.append(members)
        members.append(index)
    return order


def _check_common_inputs(items: Sequence[Grouped], members: list[int], group_id: str) -> None:
    first = items[members[0]]
    for name in COMMON_INPUTS:
        expected = strict_key(getattr(first, name))
        for index in members[1:]:
            if strict_key(getattr(items[index], name)) != expected:
                raise GroupInputError(
                    f"group {group_id!r}: candidate {items[index].id!r} has a different "
                    f"{name} than {first.id!r} (compared structurally and type-strictly)"
                )


def context_of(items: Sequence[Grouped], members: Sequence[int]) -> GroupContext:
    first = items[members[0]]
    return GroupContext(first.group_id, len(members), first.prompt, freeze(first.reference))


class NotContiguous(GroupInputError):
    """A group's items are not side by side (`position`: the first item that comes back to it)."""

    def __init__(self, group: str, position: int, started: int) -> None:
        super().__init__(
            f"group {group!r} is not contiguous (item {position}; it began at item {started})"
        )
        self.group, self.position, self.started = group, position, started


def contiguous_runs(keys: Sequence[str | None]) -> list[list[int]]:
    """Positions grouped by key, in order, for groups laid out side by side (as GRPO samplers lay
    them out); a None key is a group of its own. NotContiguous when a group comes back."""
    runs: list[list[int]] = []
    started: dict[str, int] = {}
    for position, key in enumerate(keys):
        if key is not None and position and keys[position - 1] == key:
            runs[-1].append(position)
            continue
        if key is not None:
            if key in started:
                raise NotContiguous(key, position, started[key])
            started[key] = position
        runs.append([position])
    return runs


def pack_chunks(
    groups: Sequence[Sequence[int]], size: int, at_least: bool = False
) -> list[list[int]]:
    """Whole groups, in order, into chunks; a group is never split. By default a chunk holds at
    most `size` items (a larger group travels alone); `at_least`: a chunk closes once it holds
    `size` or more (it ends at the end of a group)."""
    chunks: list[list[int]] = []
    current: list[int] = []
    for members in groups:
        if current and not at_least and len(current) + len(members) > size:
            chunks.append(current)
            current = []
        current.extend(members)
        if at_least and len(current) >= size:
            chunks.append(current)
            current = []
    if current:
        chunks.append(current)
    return chunks


def share_groups(
    groups: Sequence[Sequence[int]], load: Sequence[int], least_loaded: bool
) -> list[list[int]]:
    """Whole groups over `len(load)` workers, never cutting one: each to the least loaded worker
    (counting `load`, largest groups first), or, in request order, cut between groups nearest
    equal shares. Each share's positions are sorted."""
    count = len(load)
    shares: list[list[int]] = [[] for _ in range(count)]
    if least_loaded:
        counted = list(load)
        for members in sorted(groups, key=len, reverse=True):
            target = min(range(count), key=lambda i: (counted[i], i))
            shares[target].extend(members)
            counted[target] += len(members)
    else:
        per, filled, target = sum(len(members) for members in groups) / count, 0, 0
        for members in groups:
            while target < count - 1 and filled + len(members) / 2 > per * (target + 1):
                target += 1
            shares[target].extend(members)
            filled += len(members)
    return [sorted(share) for share in shares]
