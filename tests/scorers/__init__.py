"""The built-in scorers, the math grading pool, and the registry, each with its real env."""
