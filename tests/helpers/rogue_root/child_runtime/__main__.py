"""Run the real child main with this package's items module."""

from child_runtime import REAL

exec(compile((REAL / "__main__.py").read_text(), str(REAL / "__main__.py"), "exec"))
