"""Runnable examples: trainers rewarded through managed children, and a Posttrain-style catalog with
its recipe (examples/recipes/; the other example recipes ship in
supervisor/ops/example_recipes/)."""
