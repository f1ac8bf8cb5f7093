"""The cross-node coordinator of shared endpoint limits (docs/scale.md, "One limit across nodes").

Every caller of a limited endpoint whose `endpoint_limit` names a coordinator (or whose environment
does: `MANAGED_SCORERS_LIMITS_COORDINATOR`) takes its leases here instead of from its node's files:
`app` is the server; `hosting` runs it in a thread (a Ray actor's: `ray_host`) or as the process
itself (`managed-scorers limits-coordinator`: `supervisor.ops.limits_coordinator`). The callers'
side is `scorers.limits.remote`.
"""
