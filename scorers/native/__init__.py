"""verl-omni named native models (`reward.models.<name>.backend: native`) run as this project's
Scorer in a child of the model's env, with their score functions beside them
(`scorers.native.scorer`)."""
