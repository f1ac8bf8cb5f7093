"""Adapters to the call shapes of RL trainers (see shared/TRAINERS.md): DDPO / flow-GRPO images."""
