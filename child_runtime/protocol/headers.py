"""HTTP headers the trainer and the child agree on, beyond bearer auth."""

KEY_HEADER = "idempotency-key"  # a retried /score carries the same key and gets the same answer
REPLAY_HEADER = "idempotent-replay"  # "1" on an answer replayed from the idempotency cache
EVICTED_HEADER = "x-managed-scorers-evicted"  # on a 503 for a connection the gate closed before it sent a request
