"""The trainers' call shapes: TRL (GRPO, 3 steps), verl, DDPO, torchrun ranks, Ray, replicas,
coalescing, the examples as a user runs them.
"""
