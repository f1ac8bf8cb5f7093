"""Importing this, first in a forkserver's preload, readies the forkserver for the preload.

- **^C is ignored.** multiprocessing's forkserver ignores SIGINT only once its preload is done; a
  managed math child says ready before that, so a trainer's Ctrl-C (sent to its whole process
  group when the grader runs in-process) could kill the forkserver mid-import and break the next
  call. The owner handles ^C, and the forkserver dies with it (its alive pipe closes).
  `forkserver_gc`, preloaded last, puts back the disposition found here: multiprocessing hands
  that one to every process the forkserver forks, the trainer's own included.
- **The cyclic collector is paused.** Importing math_verify with sympy makes about 200,000
  tracked objects; with the collector on, each full collection it triggers on the way walks all
  made so far, about a quarter of the import's CPU time. `forkserver_gc`, preloaded last, freezes
  the heap and resumes it, and every worker resumes it again on entry (`worker.enter_worker`), so
  none grades with it paused.
"""

from __future__ import annotations

import gc
import signal

SIGINT_AT_START = signal.signal(signal.SIGINT, signal.SIG_IGN)
gc.disable()
