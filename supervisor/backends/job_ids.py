"""Which item holds which job id: a job service that gives one id to two enqueues is caught.

A job service's id is the only thing tying a pulled score to an upload (the service echoes nothing
of the item). If it answers the same id to two enqueues, a pull of that id yields one score for two
uploads, and nobody can tell whose. So every id is claimed by the item it was given to; an id
already claimed (by an item of the same call, of a call still pulling, or of a recent call that
took its score) is refused for the newcomer and marks the earlier claim `contested`, so that a call
still running never takes that score either. Ids stay remembered for `remembered` claims after
their pull ends (the ids in flight always are): the memory a long run spends on this is bounded.
"""

from __future__ import annotations

import itertools
import threading
from collections import OrderedDict

_calls = itertools.count(1)


def new_call() -> int:
    """A number for one call of a backend (the claims of one call know each other by it)."""
    return next(_calls)


class Claim:
    """One item's hold on one job id. `rival` is the later claim on the same id, once one came."""

    __slots__ = ("call", "done", "item_id", "job_id", "rival")

    def __init__(self, job_id: str, item_id: str, call: int) -> None:
        self.job_id, self.item_id, self.call = job_id, item_id, call
        self.done = False  # its pull ended (a score taken, or its error)
        self.rival: Claim | None = None

    @property
    def contested(self) -> bool:
        return self.rival is not None

    def held_by(self, other_call: int) -> str:
        """How the claim's holder reads from another claim of call `other_call`."""
        whose = "this call" if self.call == other_call else "an earlier call"
        state = "its pull ended" if self.done else "still pulled"
        return f"item {self.item_id!r} of {whose}, {state}"


class JobIds:
    """The claims of one backend: those of the calls in flight, and the last `remembered` that
    ended."""

    def __init__(self, remembered: int) -> None:
        if remembered < 0:
            raise ValueError("remembered must be >= 0")
        self.remembered = remembered
        self._live: dict[str, Claim] = {}
        self._ended: OrderedDict[str, Claim] = OrderedDict()
        self._lock = threading.Lock()

    def claim(self, job_id: str, item_id: str, call: int) -> tuple[Claim, Claim | None]:
        """The new claim, and the earlier one on the same id (None when the id is new). With an
        earlier one, the new claim is not registered: its item must not pull that id."""
        claim = Claim(job_id, item_id, call)
        with self._lock:
            earlier = self._live.get(job_id) or self._ended.get(job_id)
            if earlier is not None:
                earlier.rival = earlier.rival or claim
                return claim, earlier
            self._live[job_id] = claim
            return claim, None

    def pulled(self, claim: Claim) -> None:
        """The claim's pull ended (a score taken, or its error). It stays held until its whole call
        ends (`end_call`): an id given to a later item of the same call is caught however many ids
        that call holds, whatever `remembered` is."""
        with self._lock:
            claim.done = True

    def end_call(self, call: int) -> None:
        """Call `call` has its response: its claims are remembered among the last `remembered`
        ids."""
        with self._lock:
            ended = [claim for claim in self._live.values() if claim.call == call]
            for claim in ended:
                claim.done = True
                del self._live[claim.job_id]
                if self.remembered:
                    self._ended[claim.job_id] = claim
            while len(self._ended) > self.remembered:
                self._ended.popitem(last=False)

    def __len__(self) -> int:
        with self._lock:
            return len(self._live) + len(self._ended)
