"""OpenRLHF: `--reward.remote_url <this file>` (`managed-scorers integrations openrlhf` prints its path).

OpenRLHF 0.11.2 loads `reward_func(queries, prompts, labels)` from a file by path and calls it
once per sample from `asyncio.to_thread`, many at once. Here those calls are coalesced into
batched requests (the verl coalescer, on an event loop of this module's own), scored by the
training panel of the recipe `$MANAGED_SCORERS_RECIPE` names, built once per process.

What OpenRLHF hands over: `query` is prompt + response decoded with special tokens kept. The
response is the query with its prompt (`prompts[i]`) cut from the front (else from its last
occurrence; a query without it is refused), then with special tokens such as `</s>`,
`<|im_end|>` or `<|endoftext|>` stripped from both ends (tokens written `<...>` or `<|...|>`,
repeated; none inside the text is touched). The label is the reference. OpenRLHF passes no
group id, so a groupwise term is refused when the panel is built.

OpenRLHF turns any exception of a reward function into `reward=None` at INFO level: every
failure here is logged at ERROR with its typed error first, then raised.
"""

from __future__ import annotations

import asyncio
import atexit
import itertools
import logging
import os
import re
import threading
from collections.abc import Sequence
from typing import Any

from supervisor.adapters.verl import RECIPE_VARIABLE
from supervisor.compose.coalesce import Coalescer
from supervisor.compose.panel import RewardPanel
from supervisor.compose.recipes import build_panels, load_recipe
from supervisor.errors import ConfigError, ScorerRequestError
from supervisor.types import RewardItem, RewardRequest

log = logging.getLogger("supervisor.adapters.openrlhf")
CALL_TIMEOUT_S = 900.0  # one sample's wait for its batch: the panel's own deadlines end it sooner
# <|im_end|>, <|endoftext|>, <|eot_id|> ...; </s>, <s>; <eos>, <bos>, <pad>, <unk>, <end_of_turn> ...
_SPECIAL_TOKEN = r"(?:<\|[^<>|\s]{1,40}\|>|</?s>|<(?:eos|bos|pad|unk|eot|end_of_turn|start_of_turn)>)"
_AT_ENDS = re.compile(rf"^(?:\s*{_SPECIAL_TOKEN})+|(?:{_SPECIAL_TOKEN}\s*)+$")
_ITEMS = itertools.count()


def response_of(query: str, prompt: str) -> str:
    """The response inside OpenRLHF's query: the prompt cut off, special tokens stripped at both ends."""
    if query.startswith(prompt):
        response = query[len(prompt) :]
    elif prompt and prompt in query:
        response = query[query.rindex(prompt) + len(prompt) :]
    else:
        raise ScorerRequestError(
            "the query does not contain its prompt: cannot tell the response apart", kind="bad_input"
        )
    return _AT_ENDS.sub("", response).strip()


class _Scorer:
    """The panel of one recipe, with a coalescer on a private event loop fed from OpenRLHF's threads."""

    def __init__(self, recipe: str) -> None:
        train, validation = build_panels(load_recipe(recipe))
        if validation is not None:
            validation.close()
        groupwise = [leaf.shape.name for leaf in train.leaves() if leaf.shape is not None and leaf.shape.groupwise]
        if groupwise:
            train.close()
            raise ConfigError(
                f"OpenRLHF sends one sample per call and no group id: the groupwise scorer(s) {groupwise} cannot score"
            )
        self.panel: RewardPanel = train
        self.coalescer: Coalescer[RewardItem, dict[str, Any]] = Coalescer(self._score, max_batch=256, max_wait_s=0.005)
        self._loop = asyncio.new_event_loop()
        threading.Thread(target=self._loop.run_forever, name="openrlhf-coalescer", daemon=True).start()
        atexit.register(self.close)

    async def _score(self, items: list[RewardItem]) -> list[dict[str, Any]]:
        response = await self.panel.compute_rewards_async(RewardRequest(items=items))
        return [
            {"reward": reward, "terms": {t: v[i] for t, v in response.component_rewards.items() if v[i] is not None}}
            for i, reward in enumerate(response.rewards)
        ]

    def score(self, item: RewardItem) -> dict[str, Any]:
        return asyncio.run_coroutine_threadsafe(self.coalescer(item), self._loop).result(CALL_TIMEOUT_S)

    def close(self) -> None:
        self.panel.close()
        self._loop.call_soon_threadsafe(self._loop.stop)


_SCORERS: dict[tuple[int, str], _Scorer] = {}
_FAILED: dict[tuple[int, str], Exception] = {}  # a failed build fails every later call at once (no reboot per call)
_BUILDING = threading.Lock()


def scorer_for(recipe: str | None = None) -> _Scorer:
    path = recipe or os.environ.get(RECIPE_VARIABLE)
    if not path:
        raise ConfigError(f"no reward recipe: set ${RECIPE_VARIABLE} to the recipe OpenRLHF's rewards come from")
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


def reward_func(queries: Sequence[str], prompts: Sequence[str], labels: Sequence[Any]) -> dict[str, Any]:
    """OpenRLHF's reward function: `rewards` and `scores` (floats for its one-sample calls, lists
    otherwise) and `extra_logs` (each term's value)."""
    try:
        if not len(queries) == len(prompts) == len(labels):
            raise ScorerRequestError(
                f"{len(queries)} queries, {len(prompts)} prompts, {len(labels)} labels", kind="bad_input"
            )
        scorer = scorer_for()
        rows = [
            scorer.score(
                RewardItem(
                    id=f"openrlhf-{os.getpid()}-{next(_ITEMS)}", prompt=p, text=response_of(q, p), reference=label
                )
            )
            for q, p, label in zip(queries, prompts, labels, strict=True)
        ]
    except Exception as exc:
        log.error(
            "managed-scorers reward_func failed (OpenRLHF logs only at INFO, then trains on None): %s: %s",
            type(exc).__name__,
            exc,
        )
        raise
    rewards = [row["reward"] for row in rows]
    terms = sorted({name for row in rows for name in row["terms"]})
    logs = {name: [row["terms"].get(name, float("nan")) for row in rows] for name in terms}
    if len(rows) == 1:
        return {
            "rewards": rewards[0],
            "scores": rewards[0],
            "extra_logs": {name: values[0] for name, values in logs.items()},
        }
    return {"rewards": rewards, "scores": rewards, "extra_logs": logs}
