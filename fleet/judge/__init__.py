"""Judge: observed state held against the plan (health, diagnosis, slowness)."""
