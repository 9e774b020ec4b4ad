"""Catalog: facts the tool knows (GPUs, releases, vLLM defaults and flag lists, alerts,
host paths); imports nothing else of fleet."""
