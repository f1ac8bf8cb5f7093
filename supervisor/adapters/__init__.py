"""Adapters to the call shapes of RL trainers (see shared/TRAINERS.md): TRL, verl, DDPO / flow-GRPO.

May import: the top of `supervisor/` and `compose/` (distributed ranks, coalescing). Never `ops/`.
"""
