"""Processes that start, fail, restart and die: ownership across forks, orphans and zombies,
residency, load, and the fault matrix.
"""
