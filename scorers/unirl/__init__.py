"""`unirl_local`: one of UniRL's own local reward scorers (its registry's, or a user's subclass of
its `RewardBackend`), run in a managed child of an env that has UniRL and the scorer's pins."""
