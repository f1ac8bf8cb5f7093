"""The math grading pool: graders run in forkserver-started worker processes, one item at a time,
SIGKILLed at their deadline or memory budget, replaced from a warm template.

May import: the stdlib, this folder's own modules and `scorers.common` (the shared low-level
helpers). Nothing of `child_runtime`, `supervisor` or the rest of `scorers`.

Modules, owner side:
- `pool`: `GradingPool`, the facade (options, start, grade, settle, close) composing the two
  managers;
- `tasks`: the task manager: batches in flight, leader/follower driving, dispatch, deadlines,
  settling;
- `workers`: the worker manager: starting, tracking, holding back, retiring, replacing workers;
  /proc reads;
- `template_owner`: the pool's side of the template process (fork, warm, halt; clones' exit
  statuses);
- `handles`: `GradingProcess`, the one type that signals and reaps a process (worker, template,
  helper);
- `config`: `PoolConfig`, the validated options and their defaults;
- `outcomes`: `Batch` and `GradeOutcome`;
- `messages`: the frozen dataclasses sent on every pipe;
- `errors`: `GradingPoolError`, `GradingTaskError`;
- `mp_helpers`: ownership of multiprocessing's forkserver and resource tracker.
Modules, child side:
- `worker`: a worker's main loop (caps, death signal, one task at a time);
- `template`: the template's main loop (forks workers, replays tasks while idle);
- `forkserver_enter`, `forkserver_gc`: preloaded first and last: ^C ignored and the collector paused
  for the preload, then the forkserver's heap frozen and the collector resumed.
"""
