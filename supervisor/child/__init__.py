"""Owning one scorer child: launch it (posix_spawn, boot frame, readiness), talk to it (loopback
HTTP client, shared segment), read its logs, place it on this rank's GPU.

May import: the top of `supervisor/` (types, errors, config), `child_runtime.protocol`,
`scorers` (its contract, `common.bounded_http`, `common.retry`). Never `backends/`, `compose/`,
`ops/`, `adapters/`.
"""
