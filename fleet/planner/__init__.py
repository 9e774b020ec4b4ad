"""Planner: memory, fit, placement, replicas and sizing: what goes on which GPU."""
