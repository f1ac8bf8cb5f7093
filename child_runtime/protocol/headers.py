"""HTTP headers the trainer and the child agree on, beyond bearer auth."""

KEY_HEADER = "idempotency-key"  # a retried /score carries the same key and gets the same answer
REPLAY_HEADER = "idempotent-replay"  # "1" on an answer replayed from the idempotency cache
# on a 503 for a connection the gate closed before it sent a request
EVICTED_HEADER = "x-managed-scorers-evicted"
# on every /score answer (error answers too) of a scorer whose identity is known: the identity hash
# of the scorer that produced it. A client refuses an answer without it, or with another than it
# expects.
IDENTITY_HEADER = "x-managed-scorers-identity"
