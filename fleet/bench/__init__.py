"""``fleet bench``: load tests of a deployed server, with figures that can be trusted.

Modules: :mod:`~fleet.bench.client` (one timed streamed request: the metric definitions),
:mod:`~fleet.bench.runner` (load steps), :mod:`~fleet.bench.stats` (percentiles, SLOs, knee),
:mod:`~fleet.bench.servermetrics` (vLLM's /metrics), :mod:`~fleet.bench.gpu` (nvidia-smi),
:mod:`~fleet.bench.tunnel` (SSH port forward), :mod:`~fleet.bench.prompts`,
:mod:`~fleet.bench.report` (JSON, CSV, PNG, table), :mod:`~fleet.bench.command` (the CLI).

Example:
    >>> from fleet.bench.stats import percentile
    >>> percentile([1.0, 2.0, 3.0], 50)
    2.0
"""
