"""Scorer implementations and their registry; heavy imports happen in `load()`."""
from scorers.base import ScoreItem, ScoreResult, Scorer, ScorerSpec
from scorers.registry import resolve_scorer, registered_names

__all__ = ["ScoreItem", "ScoreResult", "Scorer", "ScorerSpec", "resolve_scorer", "registered_names"]
