"""What an operator runs: the `managed-scorers` CLI and what it drives (serve, score a dataset,
doctor, preflight, the shipped example recipes, the env builder, the demo).

May import anything in `supervisor/`, except `adapters/`; nothing imports `ops/` but the
package facade (`supervisor/__init__.py`, for `preflight` and the recipe loaders).
"""
