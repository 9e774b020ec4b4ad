"""Read: bytes and YAML in, located problems out (imports nothing else of fleet)."""
