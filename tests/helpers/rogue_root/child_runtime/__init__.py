"""A child runtime that answers for the wrong ids, to prove the parent refuses it.

Every module comes from the real child_runtime except `protocol.items`, whose
response_to_wire rotates the echoed ids by one.
"""

from pathlib import Path

REAL = Path(__file__).resolve().parents[4] / "child_runtime"
__path__.append(str(REAL))
