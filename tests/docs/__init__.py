"""The documentation: every code block of the README and docs/ is run or checked (test_snippets)."""
