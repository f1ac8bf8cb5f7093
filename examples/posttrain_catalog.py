"""A Posttrain-style custom catalog: a zero-argument factory naming the scorers it adds.

Each entry is a per-candidate function lifted to the group contract by `map_candidates`.
The factory must be cheap, deterministic and side-effect free: preflight and every child
resolve names through it. It may add names; it can never override a built-in.
"""

from __future__ import annotations

import re

from scorers.base import ScoreInputError, ScoreItem, Scorer, reference_answer
from scorers.groups import GroupContext
from scorers.pointwise import map_candidates

_WORD = re.compile(r"[a-z0-9]+")


def keyword_recall(
    candidate: ScoreItem, context: GroupContext, keywords_key: str = "keywords"
) -> float:
    """The fraction of the reference's keywords that the completion mentions."""
    reference = context.reference
    if not hasattr(reference, "get") or not isinstance(reference.get(keywords_key), tuple):
        raise ScoreInputError(f"item {candidate.id!r}: reference needs a {keywords_key!r} list")
    keywords = reference[keywords_key]
    words = set(_WORD.findall(candidate.required_text().lower()))
    return sum(1 for k in keywords if k.lower() in words) / len(keywords) if keywords else 0.0


def within_budget(
    candidate: ScoreItem, context: GroupContext, max_words: int = 50
) -> dict[str, float]:
    """Two terms: 1.0 when the completion fits the word budget, and its length in budgets."""
    words = len(candidate.required_text().split())
    return {"fits": float(words <= max_words), "length": words / max_words}


def answer_match(candidate: ScoreItem, context: GroupContext) -> float:
    gold = reference_answer(context.reference)
    if gold is None:
        raise ScoreInputError(f"item {candidate.id!r}: answer_match needs a reference answer")
    return float(gold.strip().lower() in candidate.required_text().lower())


KeywordRecall = map_candidates(keyword_recall, name="keyword_recall", revision="2026-11-30")
WithinBudget = map_candidates(
    within_budget, name="within_budget", terms=("fits", "length"), revision="1"
)
AnswerMatch = map_candidates(
    answer_match, name="answer_match", revision="1", required_fields=("reference",)
)


def catalog() -> dict[str, type[Scorer]]:
    return {
        "keyword_recall": KeywordRecall,
        "within_budget": WithinBudget,
        "answer_match": AnswerMatch,
    }
