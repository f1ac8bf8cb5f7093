"""Adapters to the call shapes of RL trainers (see shared/TRAINERS.md): TRL, verl, DDPO / flow-GRPO,
OpenRLHF, UniRL.

May import: the top of `supervisor/` and `compose/` (distributed ranks, coalescing). Never `ops/`.
"""
