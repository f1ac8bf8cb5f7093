"""Child side of managed-scorers: serves one scorer over loopback HTTP.

`protocol/` is what the trainer side shares with it; the rest (boot, app, host, gate,
idempotency, metrics, lifeline) runs only in the child. Imports `scorers` and its own
protocol, never `supervisor`.

Never imports torch at import time; scorer modules load their own heavy deps in `load()`.

Importing it refuses, in one line, where supervisord's files share our `supervisor` package
(`scorers.install`); in a scorer child that check ends at one stat.
"""

from scorers import install

install.refuse_supervisord_clash()
