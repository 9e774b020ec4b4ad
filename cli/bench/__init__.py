"""``fleet bench``: load tests of a deployed server, with figures that can be trusted.

Modules: :mod:`~cli.bench.client` (one timed streamed request: the metric definitions),
:mod:`~cli.bench.runner` (load steps), :mod:`~cli.bench.stats` (percentiles, SLOs, knee),
:mod:`~cli.bench.servermetrics` (vLLM's /metrics), :mod:`~cli.bench.gpu` (nvidia-smi),
:mod:`~cli.bench.tunnel` (SSH port forward), :mod:`~cli.bench.prompts`,
:mod:`~cli.bench.report` (JSON, CSV, PNG, table), :mod:`~cli.bench.command` (the CLI).

Example:
    >>> from cli.bench.stats import percentile
    >>> percentile([1.0, 2.0, 3.0], 50)
    2.0
"""
