"""Load generation: send a server streamed requests at a chosen load and measure the answers.

``fleet bench``, ``fleet doctor``'s re-measure, the benchmarks and the canary gate of a rollout
all measure with this package, so a TTFT means one thing everywhere.

Modules: :mod:`~loadgen.timing` (what each figure means, and one stream's timing),
:mod:`~loadgen.stats` (percentiles, SLOs, goodput, the knee), :mod:`~loadgen.prompts` (the
seeded synthetic prompts, JSONL files) — these three and this file need only the standard
library: a host program imports them (:mod:`hostside.canary`) and the deploy uploads them with
it (:func:`hostside.program_files`); :mod:`~loadgen.client` (one request over aiohttp),
:mod:`~loadgen.runner` (load steps: concurrency or Poisson rate, warm-up, scrapes),
:mod:`~loadgen.servermetrics` (vLLM's ``/metrics``), :mod:`~loadgen.gpu` (nvidia-smi samples)
and :mod:`~loadgen.sampler` (a command's lines, sampled in the background).

Example:
    >>> from loadgen.stats import percentile
    >>> percentile([1.0, 2.0, 3.0], 50)
    2.0
"""
