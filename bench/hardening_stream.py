"""Scenarios of issue 37 item 8 (a `RewardStream.add` that raises), measured: rows of
bench.hardening.

Public API, plus the stream's one count of unscored items (`_pending`, in both trees), so the same
file measures an older tree ("before") and this one ("now"). In-process backends: a groupwise panel
term (its groups are held until complete, so a stream fills deterministically) and a length probe.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from supervisor import LocalRewardBackend, PanelTerm, RewardItem, RewardPanel, RewardRequest

PROBE = "tests.helpers.fixture_scorers:Probe"  # reward = len(text)
SPY = "tests.helpers.fixture_scorers:GroupSpy"  # groupwise: reward = the size of the group it got


def _item(name: str, group: str | None = None) -> RewardItem:
    return RewardItem(
        id=name, text="x", group_id=group, prompt=None if group is None else f"p-{group}"
    )


def _outcome(call: Callable[[], Any]) -> str:
    """What a call did, in a few words."""
    try:
        value = call()
    except Exception as exc:  # noqa: BLE001 - the row reports whatever it raised
        first = str(exc).splitlines()[0] if str(exc) else ""
        return (
            f"{type(exc).__name__}: ...{first[-80:]}"
            if len(first) > 80
            else f"{type(exc).__name__}: {first}"
        )
    return f"ids {value.ids}" if hasattr(value, "ids") else "ok"


def _taken(add: Callable[[int], Any], most: int) -> int:
    """How many adds (up to `most`) went in before one raised."""
    for n in range(most):
        if not _outcome(lambda: add(n)).startswith("ok"):  # noqa: B023 - called at once, within its turn
            return n
    return most


def _panel() -> RewardPanel:
    return RewardPanel([PanelTerm("size", LocalRewardBackend(SPY), component="group_size")])


def add_out_of_room() -> str:
    """An add that found no room in time (max_pending 3, two groups held open), then the step goes
    on."""
    with (
        _panel() as panel,
        panel.stream(group_size=2, window=2, max_wait_s=0.0, max_pending=3, max_block_s=0.05) as s,
    ):
        s.add([_item("a0", "a"), _item("b0", "b")])
        refused = _outcome(lambda: s.add([_item("c0", "c"), _item("c1", "c")]))
        s.max_block_s = 30.0  # the barrier's bound too
        s.add(_item("a1", "a"))
        again = _outcome(lambda: s.add([_item("c0", "c"), _item("c1", "c")]))
        s.add(_item("b1", "b"))
        barrier = _outcome(s.results)
    return f"add: {refused.split(':')[0]}; the same ids added again: {again}; results(): {barrier}"


def grouped_add_refused_half_way() -> str:
    """A run [a0, loose] refused (loose has no group_id) in a stream of groups of 2, max_pending 2;
    then [a0, a1] added, the barrier, and as many single members of new groups as the stream
    takes."""
    with (
        _panel() as panel,
        panel.stream(group_size=2, window=2, max_wait_s=0.0, max_pending=2, max_block_s=0.05) as s,
    ):
        refused = _outcome(lambda: s.add([_item("a0", "a"), _item("loose")]))
        again = _outcome(lambda: s.add([_item("a0", "a"), _item("a1", "a")]))
        s.max_block_s = 30.0  # the barrier's bound too
        barrier = _outcome(s.results)
        pending = s._pending
        s.max_block_s = 0.05
        # each opens a group: it stays unscored
        held = _taken(lambda n: s.add(_item(f"h{n}", f"g{n}")), 8)
    return (
        f"add: {refused.split(':')[0]}; [a0, a1] then: {again}; results(): {barrier}; "
        f"unscored after: {pending}; then {held} items held with max_pending 2"
    )


class _InterruptedSubmit(LocalRewardBackend):
    interrupt_next = False

    def submit(self, request: RewardRequest) -> Any:
        if self.interrupt_next:
            self.interrupt_next = False
            raise KeyboardInterrupt
        return super().submit(request)


def flush_interrupted() -> str:
    """Ctrl-C in a flush's send, then the barrier (max_block_s 2)."""
    with _InterruptedSubmit(PROBE) as backend:
        # only a flush cuts
        stream = backend.stream(window=4, max_wait_s=float("inf"), max_block_s=2)
        stream.add([_item("a"), _item("b")])
        backend.interrupt_next = True
        try:
            stream.flush()
        except KeyboardInterrupt:
            pass
        began = time.monotonic()
        barrier = _outcome(stream.results)
        took = time.monotonic() - began
        stream.close()
    return f"results() after {took:.2f} s: {barrier}"


SCENARIOS = [
    ("stream: add() out of room, then the step (item 8)", add_out_of_room),
    ("stream: grouped add refused half-way (item 8)", grouped_add_refused_half_way),
    ("stream: flush interrupted mid-send (item 8)", flush_interrupted),
]
