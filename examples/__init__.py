"""Runnable examples: reward recipes in each seed style (see examples/recipes/)."""
