"""One child and its HTTP surface: endpoints, the wire codec and shared segment, the connection
gate, idempotency, the loopback client, limits, logs, metrics, fuzzing, the remote backend.
"""
