"""Spec: the fleet file as typed pydantic models, its typed strings and its JSON Schema."""
