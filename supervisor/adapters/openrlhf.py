"""OpenRLHF: `--reward.remote_url <this file>` (`managed-scorers integrations openrlhf` prints its
path).

OpenRLHF 0.11.2 loads `reward_func(queries, prompts, labels)` from a file by path and calls it
once per sample from `asyncio.to_thread`, many at once. Here those calls feed one stream
(`backend.stream`), which scores the samples that arrive together in one window, by the
training panel of the recipe `$MANAGED_SCORERS_RECIPE` names, built once per process.

What OpenRLHF hands over, and how the response is cut from its query, is one rule shared with
`managed-scorers serve`'s OpenRLHF route: `child_runtime.protocol.openrlhf`. The label is the
reference. OpenRLHF passes no group id, so a groupwise term is refused when the panel is built.

OpenRLHF turns any exception of a reward function into `reward=None` at INFO level: every
failure here is logged at ERROR with its typed error first, then raised.
"""

from __future__ import annotations

import atexit
import itertools
import logging
import os
import threading
from collections.abc import Sequence
from typing import Any

from child_runtime.protocol import openrlhf
from child_runtime.protocol.items import RequestError
from supervisor.adapters.verl import RECIPE_VARIABLE
from supervisor.compose.panel import RewardPanel
from supervisor.compose.recipes import build_panels, load_recipe
from supervisor.composition import leaf_shapes
from supervisor.errors import ConfigError, ScorerRequestError
from supervisor.types import RewardItem

log = logging.getLogger("supervisor.adapters.openrlhf")
CALL_TIMEOUT_S = 900.0  # one sample's wait for its batch: the panel's own deadlines end it sooner
_ITEMS = itertools.count()


class _Scorer:
    """The panel of one recipe, with a stream fed from OpenRLHF's threads (one call per sample): the
    samples that arrive together are scored in one window."""

    def __init__(self, recipe: str) -> None:
        train, validation = build_panels(load_recipe(recipe))
        if validation is not None:
            validation.close()
        groupwise = [shape.name for shape in leaf_shapes(train) if shape.whole_groups]
        if groupwise:
            train.close()
            raise ConfigError(openrlhf.groupwise_refusal(groupwise))
        self.panel: RewardPanel = train
        self.stream = train.stream(window=256, max_wait_s=0.005, collect=False)
        atexit.register(self.close)

    def score(self, items: list[RewardItem]) -> list[dict[str, Any]]:
        """Each item's reward and the terms that have a value for it."""
        rows = [row.result(CALL_TIMEOUT_S) for row in self.stream.add(items)]
        return [
            {
                "reward": row.reward,
                "terms": {t: v for t, v in row.components.items() if v is not None},
            }
            for row in rows
        ]

    def close(self) -> None:
        self.stream.close()
        self.panel.close()


_SCORERS: dict[tuple[int, str], _Scorer] = {}
# a failed build fails every later call at once (no reboot per call)
_FAILED: dict[tuple[int, str], Exception] = {}
_BUILDING = threading.Lock()


def scorer_for(recipe: str | None = None) -> _Scorer:
    path = recipe or os.environ.get(RECIPE_VARIABLE)
    if not path:
        raise ConfigError(
            f"no reward recipe: set ${RECIPE_VARIABLE} to the recipe OpenRLHF's rewards come from"
        )
    key = (os.getpid(), os.path.realpath(path))
    with _BUILDING:
        if key in _FAILED:
            raise _FAILED[key]
        if key not in _SCORERS:
            try:
                _SCORERS[key] = _Scorer(key[1])
            except Exception as exc:
                _FAILED[key] = exc
                raise
        return _SCORERS[key]


def _samples(
    queries: Sequence[str], prompts: Sequence[str], labels: Sequence[Any]
) -> list[openrlhf.Sample]:
    """OpenRLHF's lists cut into samples (the rule `serve`'s OpenRLHF route uses); a bad one is bad
    input."""
    try:
        return openrlhf.samples(queries, prompts, labels)
    except RequestError as exc:
        raise ScorerRequestError(str(exc), kind="bad_input") from exc


def reward_func(
    queries: Sequence[str], prompts: Sequence[str], labels: Sequence[Any]
) -> dict[str, Any]:
    """OpenRLHF's reward function: `rewards` and `scores` (floats for its one-sample calls, lists
    otherwise) and `extra_logs` (each term's value)."""
    try:
        samples = _samples(queries, prompts, labels)
        scorer = scorer_for()
        rows = scorer.score(
            [
                RewardItem(
                    id=f"openrlhf-{os.getpid()}-{next(_ITEMS)}",
                    prompt=s.prompt,
                    text=s.response,
                    reference=s.label,
                )
                for s in samples
            ]
        )
    except Exception as exc:
        log.error(
            "managed-scorers reward_func failed (OpenRLHF logs only at INFO, then trains on "
            "None): %s: %s",
            type(exc).__name__,
            exc,
        )
        raise
    terms = sorted({name for row in rows for name in row["terms"]})
    logs = {name: [row["terms"].get(name, float("nan")) for row in rows] for name in terms}
    return openrlhf.answer([row["reward"] for row in rows], logs)
