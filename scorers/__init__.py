"""Scorer implementations and their registry; heavy imports happen in `load()`."""

from scorers.base import ScoreItem, Scorer, ScoreResult, ScorerSpec
from scorers.registry import registered_names, resolve_scorer

__all__ = ["ScoreItem", "ScoreResult", "Scorer", "ScorerSpec", "resolve_scorer", "registered_names"]
