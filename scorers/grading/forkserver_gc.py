"""Importing this, last in a forkserver's preload, freezes what the preload built (gc.freeze).

Every grading worker is a fork of the forkserver. Unfrozen, the preloaded heap (math_verify
with sympy: about 100,000 tracked objects) is walked by each full collection in every worker:
a 50-60 ms pause that lands on whichever item happens to be grading, making ordinary items
look slow next to a soft deadline, and writing to pages the fork shared (copy-on-write
faults in each fresh worker). Frozen, a collection walks only the objects made since. The
collector, paused for the preload by `forkserver_enter`, resumes here, and SIGINT gets back the
disposition the forkserver started with (multiprocessing ignores it from here on, and gives every
process it forks the one it found).

No collection runs before the freeze: it would walk the whole preloaded heap once (about 50 ms,
6 % of a math child's boot CPU) to free the preload's cyclic garbage, about 2,400 objects and
0.3 MB that stay frozen instead, on pages every fork shares and none writes.
"""

from __future__ import annotations

import gc
import signal

from scorers.grading.forkserver_enter import SIGINT_AT_START

gc.freeze()
gc.enable()
if SIGINT_AT_START is not None:  # None: a handler set outside Python, which it cannot put back
    signal.signal(signal.SIGINT, SIGINT_AT_START)
