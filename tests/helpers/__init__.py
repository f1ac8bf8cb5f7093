"""Not tests: the scorers, scripts and fixtures the tests start (fixture scorers by dotted path,
trainers run in their own env, parents that die on purpose, a rogue child runtime).
"""
