"""Host plan: the typed plan a host gets and its builders (units, environment, files)."""
