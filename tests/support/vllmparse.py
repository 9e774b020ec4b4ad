"""Read rendered vLLM command lines with vLLM's own parser, in one vLLM process.

``vllm_parse(python, lines)`` runs ``hostside/validate_args.py`` (``main`` on each line, then
the release's ``make_arg_parser`` on its server words) under ``python``, a Python with vLLM
installed (``tests.unit.fleet.test_flags.vllm_python()`` finds one), and returns per name
``[exit status of the check, what it printed, vars() of the parsed namespace]``.

Example (needs vLLM)::

    results = vllm_parse(python, {"chat": "/opt/venv/bin/vllm serve m --port 8000"})
    results["chat"][0], results["chat"][2]["port"]      # (0, 8000)
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

VALIDATOR = Path(__file__).resolve().parents[2] / "hostside" / "validate_args.py"

#: The program run under vLLM's python: one process for every line (vLLM imports in seconds).
DRIVER = """
import contextlib, io, json, sys
sys.path.insert(0, sys.argv[1])
import validate_args
results = {}
for name, line in json.loads(sys.argv[2]).items():
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        code = validate_args.main(["--name", name, "--exec-start", line])
    parser, _ = validate_args.build_parser()
    words = validate_args.server_words(validate_args.split_exec_start(line))
    parsed = vars(parser.parse_args(words))
    results[name] = [code, out.getvalue(), json.loads(json.dumps(parsed, default=repr))]
print("RESULTS " + json.dumps(results))
"""


def vllm_parse(python: str, lines: dict[str, str], timeout: float = 600) -> dict[str, list[Any]]:
    """Each named ExecStart line through vLLM's parser: {name: [code, output, parsed args]}."""
    run = subprocess.run(
        [python, "-c", DRIVER, str(VALIDATOR.parent), json.dumps(lines)],
        capture_output=True, text=True, timeout=timeout, check=False,
    )
    found = [line for line in run.stdout.splitlines() if line.startswith("RESULTS ")]
    assert found, run.stdout[-2000:] + run.stderr[-2000:]
    return json.loads(found[-1][len("RESULTS "):])
