"""Our ScoreItems -> UniRL 0.2.0's RewardRequest, and its RewardResponse -> our ScoreResult.

UniRL's scorers read columns: `generated` media by kind (float CHW images and TCHW videos in [0, 1]
as torch tensors; `Texts`), `conditioning` images (an edit's source), the prompt
(`original_prompt` / `generation_prompt`: both are the item's prompt, which the drop-in picked by
`prompt_source`), `metadata`, `sample_ids`, `group_ids`. A reward UniRL marks unsuccessful, or a
non-finite one, is that item's failure, never a value.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from scorers.base import ScoreItem, ScoreResult


def _pixels(array: Any) -> Any:
    """uint8 HWC -> float CHW in [0, 1] (a copy: the item's view may be read-only)."""
    import torch

    return torch.from_numpy(array.copy()).permute(2, 0, 1).float() / 255.0


def _frames(array: Any) -> Any:
    """uint8 THWC -> float TCHW in [0, 1]."""
    import torch

    return torch.from_numpy(array.copy()).permute(0, 3, 1, 2).float() / 255.0


def _generated(kind: str, items: Sequence[ScoreItem]) -> dict[str, Any]:
    from unirl.types.primitives import Image, Images, Texts, Video, Videos

    if kind == "text":
        return {"text": Texts(texts=[item.required_text() for item in items])}
    if kind == "video":
        return {"video": Videos.from_list([Video(_frames(i.required_video())) for i in items])}
    return {"image": Images.from_list([Image(_pixels(i.required_image())) for i in items])}


def _conditioning(items: Sequence[ScoreItem]) -> dict[str, Any]:
    """The first condition image of each item, when every item has one (an edit's source)."""
    if not items or not all(item.condition_images for item in items):
        return {}
    from unirl.types.primitives import Image, Images

    return {"image": Images.from_list([Image(_pixels(i.condition_images[0])) for i in items])}


def _column(values: list[Any]) -> list[Any] | None:
    """A column UniRL reads whole: None unless every item has a value."""
    return None if any(value is None for value in values) else values


def unirl_request(kind: str, items: Sequence[ScoreItem]) -> Any:
    from unirl.types.primitives import Texts
    from unirl.types.reward import RewardRequest

    prompts = _column([item.prompt for item in items])
    texts = None if prompts is None else Texts(texts=list(prompts))
    metadata = [dict(item.metadata) or None for item in items]
    return RewardRequest(
        generated=_generated("image" if kind == "image_edit" else kind, items),
        conditioning=_conditioning(items),
        original_prompt=texts,
        generation_prompt=texts,
        metadata=metadata if any(m is not None for m in metadata) else None,
        sample_ids=[item.id for item in items],
        group_ids=_column([item.group_id for item in items]),
    )


def _number(reward: Any) -> float:
    """The reward as a float; NaN for anything that is not a number (a bool is not one here)."""
    if isinstance(reward, bool):
        return math.nan
    try:
        return float(reward)
    except (TypeError, ValueError):
        return math.nan


def score_result(term: str, response: Any, count: int) -> ScoreResult:
    """One term; an item UniRL marked failed, or whose reward is not a finite number, is failed."""
    rewards = list(response.rewards)
    if len(rewards) != count:
        raise RuntimeError(f"UniRL scorer {term!r} returned {len(rewards)} rewards for {count}")
    successes = list(response.successes or [True] * count)
    errors = list(response.errors or [None] * count)
    values: list[float] = []
    failed: dict[int, str] = {}
    for index, (reward, ok, error) in enumerate(zip(rewards, successes, errors, strict=True)):
        value = _number(reward)
        if not ok or not math.isfinite(value):
            failed[index] = str(error or f"UniRL scorer {term!r} gave {reward!r}, not a reward")
            values.append(math.nan)
        else:
            values.append(value)
    return ScoreResult(terms={term: values}, failed=failed)
