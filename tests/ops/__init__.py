"""What an operator runs: the CLI (score, serve, doctor), preflight, recipes, env builds, a
pip-installed trainer, and the bench smoke tests.
"""
