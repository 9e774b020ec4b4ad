"""``fleet bench``: load tests of a deployed server, with figures that can be trusted.

The load and its measurement are :mod:`loadgen`'s; this package is the command around them:
:mod:`~cli.bench.command` (the CLI), :mod:`~cli.bench.tunnel` (SSH port forward),
:mod:`~cli.bench.report` (JSON, CSV, PNG, table), the staged plan (:mod:`~cli.bench.plan`,
:mod:`~cli.bench.stages`, :mod:`~cli.bench.memory`, :mod:`~cli.bench.runreport`,
:mod:`~cli.bench.plancommand`) and :mod:`~cli.bench.compare`.

Example:
    >>> from cli.bench.tunnel import forward_argv
    >>> callable(forward_argv)
    True
"""
