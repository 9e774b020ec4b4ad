"""``fleet status``: one screen for the whole fleet, read from its hosts (and Prometheus).

Modules: ``probe`` (one ssh round trip per host: units, /health, /metrics, GPU health,
journal), ``model`` (pure: probes → typed rows, levels against :mod:`fleet.judge.health`),
``prometheus`` (the HTTP API), ``startup`` (time to ready, from the server's log lines),
``view`` (rich tables), ``command`` (the CLI).
"""
