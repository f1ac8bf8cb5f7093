"""Child side of managed-scorers: serves one scorer over loopback HTTP.

Never imports torch at import time; scorer modules load their own heavy deps in `load()`.
"""
