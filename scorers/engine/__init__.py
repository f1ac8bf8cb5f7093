"""verl-omni named engine models (`reward.models.<name>.backend: engine`): an OpenAI-compatible
engine process (vLLM, `transformers serve`) owned by a scorer child of the model's env, its
reward functions called beside it with `reward_router_address` and `model_name`
(`scorers.engine.scorer`)."""
