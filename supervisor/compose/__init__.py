"""Backends made of backends: panels of terms, replicas, ranks sharing a pool (`distributed`),
micro-batch overlap, coalescing a trainer's per-sample calls, and panels built from recipes
(`recipes`).

May import: the top of `supervisor/`, `child/`, `backends/`, `scorers` (its contract).
Never `ops/` or `adapters/`.
"""
