"""The built-in scorers, the ones users pick by name (`scorers.registry.BUILTINS`), with their
helpers.

Apart from the contract at the top of `scorers/`, which they import like any scorer does. Their old
names (`scorers.math_verify`, ...) still import the same modules (`scorers.aliases`). Nothing is
imported here: a child loads only the scorer it runs.
"""
