"""The three RewardBackends: in-process (`local`), a managed child (`managed`), a server someone
else started (`remote`), and the Prometheus collector that reads their counters.

May import: the top of `supervisor/`, `child/`, `child_runtime.protocol`, `scorers`.
Never `compose/`, `ops/`, `adapters/`.
"""
