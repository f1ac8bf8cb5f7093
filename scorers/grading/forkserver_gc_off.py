"""Importing this, first in a forkserver's preload, pauses the cyclic collector for the preload.

Importing math_verify with sympy makes about 200,000 tracked objects; with the collector on,
each full collection it triggers on the way walks all made so far, about a quarter of the
import's CPU time. `forkserver_gc`, preloaded last, freezes the heap and resumes it, and
every worker resumes it again on entry (`worker.enter_worker`), so none grades with it paused.
"""

from __future__ import annotations

import gc

gc.disable()
