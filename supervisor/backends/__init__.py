"""The RewardBackends that score: in-process (`local`), a managed child (`managed`), a server
someone else started (`remote`), an asynchronous job service (`jobs`, its payload files in `spool`),
and the Prometheus collector that reads their counters.

May import: the top of `supervisor/`, `child/`, `child_runtime.protocol`, `scorers`.
Never `compose/`, `ops/`, `adapters/`.
"""
