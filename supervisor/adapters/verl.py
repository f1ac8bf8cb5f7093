"""verl: `compute_score(data_source, solution_str, ground_truth, extra_info)` and the batch form.

verl calls the per-item form once per rollout; the batch form (`BatchRewardManager`) gets
lists. Both return `{"score": reward, <term>: value, ...}` (verl logs the other keys).
An item's id comes from `extra_info["index"]` (or `"uid"`) when present. verl-omni's visual
reward manager passes `solution_image` (a uint8 CHW tensor) instead of `solution_str`. The async
form feeds the per-item tasks verl's reward loop makes into the backend's stream, which scores those
that arrive together in one window (`max_batch`, `max_wait_s`; `coalesce=False` sends one request
per item).
"""

from __future__ import annotations

import asyncio
import atexit
import itertools
import math
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from supervisor.adapters import items as adapter_items
from supervisor.backend import RewardBackend
from supervisor.compose.recipes import build_panel, load_recipe
from supervisor.errors import ConfigError, ScorerRequestError
from supervisor.stream import ItemReward, RewardStream
from supervisor.tensors import numpy_view
from supervisor.types import RewardItem, RewardRequest, RewardResponse

_IDS = itertools.count()


def _item(
    data_source: str | None,
    solution_str: str | None,
    ground_truth: Any,
    extra_info: Mapping[str, Any] | None,
    solution_image: Any = None,
) -> RewardItem:
    extra = dict(extra_info or {})
    key = extra.get("index", extra.get("uid"))
    item_id = f"verl-{key}-{next(_IDS)}" if key is not None else f"verl-{next(_IDS)}"
    image = None
    if solution_image is not None:  # verl-omni: one uint8 CHW image (a torch tensor or an array)
        chw = numpy_view(solution_image)
        if getattr(chw, "ndim", None) != 3:
            raise ScorerRequestError(
                f"solution_image must be one CHW image, got shape "
                f"{list(getattr(chw, 'shape', []))}",
                kind="bad_input",
            )
        image = chw.transpose(1, 2, 0)
    where = f"verl item {item_id!r} (data_source {data_source!r})"
    return adapter_items.item(
        where,
        id=item_id,
        text=solution_str,
        image=image,
        reference=ground_truth,
        data_source=data_source,
    )


class VerlScore(dict[str, Any]):
    """One item's answer: `{"score": reward, <term>: value, ...}`, which every reward-loop manager
    reads. verl's legacy `prime` manager reads `float(result[0])` instead (and turns the KeyError a
    plain dict gives into a silent 0.0 for the whole batch): index 0 answers the score, as a key
    that is never listed, so the reward loop's logged keys stay `score` and the terms."""

    def __missing__(self, key: Any) -> Any:
        if key == 0 and "score" in self:
            return self["score"]
        raise KeyError(key)


def _scores(response: RewardResponse) -> list[dict[str, Any]]:
    """One dict per item with the same keys on every item (verl reads the keys of the first one):
    `score`, then each term; a term with no value for an item (not applicable to its dataset, or
    an optional panel term that failed) logs NaN there. The reward itself is never NaN."""
    return [
        _score(reward, {name: values[i] for name, values in response.component_rewards.items()})
        for i, reward in enumerate(response.rewards)
    ]


def _score(reward: float, components: Mapping[str, float | None]) -> VerlScore:
    if "score" in components:
        raise ConfigError(
            "a term named 'score' would hide the reward verl trains on: rename the term"
        )
    return VerlScore(
        score=reward, **{name: math.nan if v is None else v for name, v in components.items()}
    )


def _row_score(row: ItemReward) -> VerlScore:
    return _score(row.reward, row.components)


class VerlComputeScore:
    """`compute_score` for verl's reward loop (sync) with `compute_score_batch` for the batch
    manager, and `acompute_score` for an async reward loop (the event loop stays free while it
    scores)."""

    def __init__(
        self,
        backend: RewardBackend,
        coalesce: bool = True,
        max_batch: int = 256,
        max_wait_s: float = 0.005,
    ) -> None:
        self.backend = backend
        self.__name__ = "compute_score"
        self.coalesce, self.max_batch, self.max_wait_s = coalesce, max_batch, max_wait_s
        # made on the first async call (the sync paths need none)
        self._stream: RewardStream | None = None
        self._making = threading.Lock()

    @property
    def stream(self) -> RewardStream:
        """The per-item calls' stream: the items that arrive together are scored in one window."""
        with self._making:
            if self._stream is None:
                self._stream = self.backend.stream(
                    window=self.max_batch, max_wait_s=self.max_wait_s, collect=False
                )
            return self._stream

    def __call__(
        self,
        data_source: str | None,
        solution_str: str | None = None,
        ground_truth: Any = None,
        extra_info: Mapping[str, Any] | None = None,
        solution_image: Any = None,
        **_: Any,
    ) -> dict[str, Any]:
        request = RewardRequest(
            items=[_item(data_source, solution_str, ground_truth, extra_info, solution_image)]
        )
        return _scores(self.backend.compute_rewards(request))[0]

    async def acompute_score(
        self,
        data_source: str | None,
        solution_str: str | None = None,
        ground_truth: Any = None,
        extra_info: Mapping[str, Any] | None = None,
        solution_image: Any = None,
        **_: Any,
    ) -> dict[str, Any]:
        item = _item(data_source, solution_str, ground_truth, extra_info, solution_image)
        if self.coalesce:
            (row,) = self.stream.add(item)
            return _row_score(await asyncio.wrap_future(row))
        return _scores(await self.backend.compute_rewards_async(RewardRequest(items=[item])))[0]

    def compute_score_batch(
        self,
        data_sources: Sequence[str | None],
        solution_strs: Sequence[str],
        ground_truths: Sequence[Any],
        extra_infos: Sequence[Mapping[str, Any] | None] | None = None,
        **_: Any,
    ) -> list[dict[str, Any]]:
        extras = extra_infos if extra_infos is not None else [None] * len(solution_strs)
        if not len(data_sources) == len(solution_strs) == len(ground_truths) == len(extras):
            raise ValueError(
                "data_sources, solution_strs, ground_truths and extra_infos differ in length"
            )
        items = [
            _item(*row)
            for row in zip(data_sources, solution_strs, ground_truths, extras, strict=True)
        ]
        return _scores(self.backend.compute_rewards(RewardRequest(items=items)))


# -- installed use, no file to copy -----------------------------------------------------------
# reward.custom_reward_function: {path: pkg://supervisor.adapters.verl, name: compute_score,
#                                 reward_kwargs: {recipe: /path/reward.yaml}}
# verl loads the function by module (so its partial pickles by reference: the `remote` manager
# ships it to other workers) and passes reward_kwargs on every call. Each process builds one
# panel per recipe on its first call, off the event loop, and closes it at exit; a process made
# by fork builds its own (a backend belongs to the process that made it).
RECIPE_VARIABLE = "MANAGED_SCORERS_RECIPE"  # the recipe when reward_kwargs names none
_SCORERS: dict[tuple[Any, ...], VerlComputeScore] = {}
_FAILED: dict[tuple[Any, ...], Exception] = {}
_BUILDING = threading.Lock()


def process_scorer(key: tuple[str, ...], build: Callable[[], RewardBackend]) -> VerlComputeScore:
    """This process's `VerlComputeScore` under `key`, over the backend `build()` makes on first use
    and closes at exit. A build that failed fails every later call of this process with the same
    error (no call waits out a boot). The cache lives here, in an importable module, so a reward
    file that uses it holds no lock of its own and pickles (verl's `remote` manager ships it)."""
    cached = (os.getpid(), *key)
    with _BUILDING:
        if cached in _FAILED:
            raise _FAILED[cached]
        if cached not in _SCORERS:
            try:
                backend = build()
            except Exception as exc:
                _FAILED[cached] = exc
                raise
            atexit.register(backend.close)
            _SCORERS[cached] = VerlComputeScore(backend)
        return _SCORERS[cached]


def ready_scorer(key: tuple[str, ...]) -> VerlComputeScore | None:
    """The scorer `process_scorer` built for `key` in this process, or None before its first
    call."""
    return _SCORERS.get((os.getpid(), *key))


_BOOTS: dict[tuple[Any, ...], asyncio.Future[VerlComputeScore]] = {}


async def aprocess_scorer(
    key: tuple[str, ...], build: Callable[[], RewardBackend]
) -> VerlComputeScore:
    """`process_scorer` for the async reward loop: the boot runs off the event loop, once per loop.
    The step's first tasks all wait on that one boot and resume in the same loop turn, so they
    reach the stream together (one window), instead of returning in waves from a thread each
    (and holding every executor thread while the boot runs). A cancelled waiter leaves the boot
    to the others; a failed boot fails every waiter, as `process_scorer` fails every later call."""
    ready = ready_scorer(key)
    if ready is not None:
        return ready
    loop = asyncio.get_running_loop()
    slot = (os.getpid(), id(loop), *key)
    boot = _BOOTS.get(slot)
    if boot is None or boot.get_loop() is not loop:
        boot = _BOOTS[slot] = asyncio.ensure_future(asyncio.to_thread(process_scorer, key, build))
        boot.add_done_callback(
            lambda done: _BOOTS.pop(slot, None) if _BOOTS.get(slot) is done else None
        )
    return await asyncio.shield(boot)


def _key(recipe: str | None, panel: str) -> tuple[str, str]:
    path = recipe or os.environ.get(RECIPE_VARIABLE)
    if not path:
        raise ConfigError(
            f"no reward recipe: give reward_kwargs: {{recipe: /path/reward.yaml}} to verl's "
            f"custom_reward_function, or set ${RECIPE_VARIABLE}"
        )
    if panel not in ("train", "validation"):
        raise ConfigError(f"panel must be 'train' or 'validation', got {panel!r}")
    return os.path.realpath(path), panel


def _recipe_panel(path: str, panel: str) -> RewardBackend:
    """Only the panel this process scores with is started (a validation worker boots no training
    terms)."""
    recipe = load_recipe(path)
    spec = recipe.train if panel == "train" else recipe.validation
    if spec is None:
        raise ConfigError(f"{path} has no validation panel")
    return build_panel(spec)


def scorer_for(recipe: str | None = None, panel: str = "train") -> VerlComputeScore:
    """This process's `VerlComputeScore` over the recipe's panel (`train` or `validation`), built on
    first use."""
    key = _key(recipe, panel)
    return process_scorer(key, lambda: _recipe_panel(*key))


async def compute_score(
    data_source: str | None,
    solution_str: str | None = None,
    ground_truth: Any = None,
    extra_info: Mapping[str, Any] | None = None,
    *,
    recipe: str | None = None,
    panel: str = "train",
    **kwargs: Any,
) -> dict[str, Any]:
    """verl's reward loop (every manager, async): one call per rollout, coalesced into requests."""
    key = _key(recipe, panel)
    ready = await aprocess_scorer(key, lambda: _recipe_panel(*key))
    return await ready.acompute_score(data_source, solution_str, ground_truth, extra_info, **kwargs)


def compute_score_sync(
    data_source: str | None,
    solution_str: str | None = None,
    ground_truth: Any = None,
    extra_info: Mapping[str, Any] | None = None,
    *,
    recipe: str | None = None,
    panel: str = "train",
    **kwargs: Any,
) -> dict[str, Any]:
    """The same for a caller that wants a plain function (verl runs it in an executor)."""
    return scorer_for(recipe, panel)(data_source, solution_str, ground_truth, extra_info, **kwargs)


def compute_score_batch(
    data_sources: Sequence[str | None],
    solution_strs: Sequence[str],
    ground_truths: Sequence[Any],
    extra_infos: Sequence[Mapping[str, Any] | None] | None = None,
    *,
    recipe: str | None = None,
    panel: str = "train",
    **kwargs: Any,
) -> list[dict[str, Any]]:
    """verl's legacy batch form: lists in, one dict per item out."""
    return scorer_for(recipe, panel).compute_score_batch(
        data_sources, solution_strs, ground_truths, extra_infos
    )
