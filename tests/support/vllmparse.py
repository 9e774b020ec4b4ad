"""Read rendered vLLM command lines with vLLM's own parser, in one vLLM process per test run.

``vllm_parse(python, lines)`` runs ``hostside/validate_args.py`` (``main`` on each line, then
the release's ``make_arg_parser`` on its server words) under ``python``, a Python with vLLM
installed (``tests.unit.fleet.test_flags.vllm_python()`` finds one), and returns per name
``[exit status of the check, what it printed, vars() of the parsed namespace]``.
``vllm_main(python, argvs)`` runs ``validate_args.main`` on whole argument lists (the flag
checks' own cases): per name ``[exit status, what it printed]``.

vLLM takes ~12 s of CPU to import, so every caller of the test run shares one process per
``python`` (:class:`Worker`: started on first use, asked over a pipe, ended at exit) instead of
paying the import once per test module.

Example (needs vLLM)::

    results = vllm_parse(python, {"chat": "/opt/venv/bin/vllm serve m --port 8000"})
    results["chat"][0], results["chat"][2]["port"]      # (0, 8000)
    vllm_main(python, {"bad": ["--", "--model", "/m", "--no-such-flag"]})["bad"][0]   # 1
"""

from __future__ import annotations

import atexit
import json
import subprocess
from pathlib import Path
from typing import Any

VALIDATOR = Path(__file__).resolve().parents[2] / "hostside" / "validate_args.py"

#: The program run under vLLM's python: one request a line on stdin, one answer a line out.
DRIVER = """
import contextlib, io, json, sys, traceback
sys.path.insert(0, sys.argv[1])
import validate_args

def parse(lines):
    results = {}
    for name, line in lines.items():
        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            code = validate_args.main(["--name", name, "--exec-start", line])
        parser, _ = validate_args.build_parser()
        words = validate_args.server_words(validate_args.split_exec_start(line))
        parsed = vars(parser.parse_args(words))
        results[name] = [code, out.getvalue(), json.loads(json.dumps(parsed, default=repr))]
    return results

def main_of(argvs):
    results = {}
    for name, argv in argvs.items():
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = validate_args.main(argv)
        results[name] = [code, out.getvalue() + err.getvalue()]
    return results

for request in sys.stdin:
    kind, payload = json.loads(request)
    try:
        answer = "RESULTS " + json.dumps((parse if kind == "lines" else main_of)(payload))
    except BaseException:
        answer = "FAILED " + json.dumps(traceback.format_exc())
    sys.__stdout__.write(answer + "\\n")
    sys.__stdout__.flush()
"""


class Worker:
    """One vLLM process answering parse requests (see :data:`DRIVER`)."""

    def __init__(self, python: str) -> None:
        self.python = python
        self.process = subprocess.Popen(
            [python, "-c", DRIVER, str(VALIDATOR.parent)], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip

    def ask(self, kind: str, payload: dict[str, Any]) -> dict[str, list[Any]]:
        """One request's answer; what vLLM printed besides (its log lines) is skipped, and shown
        if the process ends instead."""
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(json.dumps([kind, payload]) + "\n")
        self.process.stdin.flush()
        seen = []
        for line in self.process.stdout:
            if line.startswith("RESULTS "):
                return json.loads(line[len("RESULTS "):])
            if line.startswith("FAILED "):
                raise AssertionError(json.loads(line[len("FAILED "):]))
            seen.append(line)
        raise AssertionError(f"{self.python}'s vLLM parser ended: {''.join(seen)[-2000:]}")

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


_WORKERS: dict[str, Worker] = {}


def _worker(python: str) -> Worker:
    if python not in _WORKERS or _WORKERS[python].process.poll() is not None:
        _WORKERS[python] = Worker(python)
    return _WORKERS[python]


@atexit.register
def _close_all() -> None:
    for worker in _WORKERS.values():
        worker.close()


def vllm_parse(python: str, lines: dict[str, str]) -> dict[str, list[Any]]:
    """Each named ExecStart line through vLLM's parser: {name: [code, output, parsed args]}."""
    return _worker(python).ask("lines", lines)


def vllm_main(python: str, argvs: dict[str, list[str]]) -> dict[str, list[Any]]:
    """``validate_args.main(argv)`` for each named argument list: {name: [code, output]}."""
    return _worker(python).ask("argv", argvs)
