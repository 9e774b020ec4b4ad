"""Helpers of the end-to-end tests: pyinfra and ``fleet`` as a person runs them, on sandbox hosts.

Every e2e module drives the product from the outside: a fleet file on disk, ``pyinfra -y
inventory.py deploy.py`` and ``fleet …`` run from the repository root with ``FLEET`` set, and
shell commands on the sandbox host over SSH. The modules that serve vLLM share one host,
:data:`VLLM_HOST` (started once per session by tests/e2e/conftest.py); each deploys its own
fleet file onto it, and the deploy retires the servers of the module before.

Example:
    result = deploy(fleet_file, env={"FLEET_E2E_API_KEY": "secret"})
    changes(output(result))                                  # → 0 on a second deploy
    on_host("systemctl is-active vllm-chat.service").stdout  # → 'active\\n'
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from sandbox import hosts as sandbox

ROOT = Path(__file__).resolve().parents[2]
#: Where this interpreter's ``pyinfra`` and ``fleet`` live (the checkout's venv).
BIN = Path(sys.executable).parent

#: The sandbox host every vLLM module deploys to, started once for the session.
VLLM_HOST = "e2e-vllm"
#: The server ports the modules use on it, all declared when it starts (sandbox hosts share
#: this machine's network, so each module keeps its own).
LIFECYCLE_PORT = 18100
ALPHA_PORT, BETA_PORT = 18200, 18201
BENCH_PORT = 18300
#: The bench module's second server, for the plan's mixed stage (two servers on one host).
BENCH_PORT_B = 18301
#: The TLS module's server (https only).
TLS_PORT = 18110
#: Port blocks of the areas that came later, 20 each, declared on both shared hosts:
#: endpoints and routers, multi-node groups, monitoring (Prometheus, exporters), fleet doctor.
ENDPOINT_PORTS = list(range(18400, 18420))
MULTINODE_PORTS = list(range(18500, 18520))
MONITORING_PORTS = list(range(18600, 18620))
DOCTOR_PORTS = list(range(18700, 18720))
VLLM_HOST_PORTS = [
    LIFECYCLE_PORT, TLS_PORT, ALPHA_PORT, BETA_PORT, BENCH_PORT, BENCH_PORT_B,
    *ENDPOINT_PORTS, *MULTINODE_PORTS, *MONITORING_PORTS, *DOCTOR_PORTS,
]  # fmt: skip
#: The second shared host, for what needs two (replicas behind a router, a group across
#: hosts). Sandbox hosts share this machine's network, so its ports are the same blocks: a
#: module puts a service on one host or the other, never the same port on both.
VLLM_HOST_B = "e2e-vllm-b"

#: The committed tiny model, served on loopback for the session (tests/e2e/conftest.py).
TESTMODEL = ROOT / "testmodel"
TESTMODEL_PORT = 18765
TESTMODEL_URL = f"http://127.0.0.1:{TESTMODEL_PORT}/tiny-llama.tar.gz"
TESTMODEL_SHA = (TESTMODEL / "tiny-llama.tar.gz.sha256").read_text().split()[0]


def run(
    argv: list[str], fleet: Path, env: dict[str, str] | None = None, timeout: float = 900
) -> subprocess.CompletedProcess:
    """A command from the repository root with ``FLEET`` (and ``env``) set; never raises on exit.

    + argv: the command line
    + fleet: the fleet file, exported as ``FLEET`` (what inventory.py reads)
    + env: more variables, e.g. the API key a fleet file names with ``{env: …}``
    + timeout: seconds before the command is killed (a failure of the test)

    Example:
        run([str(BIN / "fleet"), "check", str(fleet)], fleet).returncode   # → 0
    """
    return subprocess.run(
        argv, cwd=ROOT, env={**os.environ, "FLEET": str(fleet), **(env or {})},
        capture_output=True, text=True, timeout=timeout, check=False,
    )  # fmt: skip


def deploy(
    fleet: Path, env: dict[str, str] | None = None, *flags: str
) -> subprocess.CompletedProcess:
    """``pyinfra -y [FLAGS] inventory.py deploy.py`` on a fleet file.

    Example:
        deploy(fleet, {"FLEET_E2E_API_KEY": "secret"}, "-vv").returncode   # → 0
    """
    return run([str(BIN / "pyinfra"), "-y", *flags, "inventory.py", "deploy.py"], fleet, env)


def fleet_cli(
    fleet: Path, *args: str, env: dict[str, str] | None = None, timeout: float = 900
) -> subprocess.CompletedProcess:
    """``fleet ARGS`` with ``FLEET`` set to ``fleet`` (the arguments name files themselves).

    Example:
        fleet_cli(fleet, "drift", str(fleet), "--json").returncode   # → 0 (clean)
    """
    return run([str(BIN / "fleet"), *args], fleet, env, timeout)


def output(result: subprocess.CompletedProcess) -> str:
    """stdout and stderr together.

    Example:
        >>> output(subprocess.CompletedProcess([], 0, "out ", "err"))
        'out err'
    """
    return result.stdout + result.stderr


def changes(text: str) -> int:
    """The number of operations that changed something, from pyinfra's results table.

    Example:
        >>> changes("    Grand total   19   12   -   7")
        12
        >>> changes("    Grand total   19   -   -   19")
        0
    """
    match = re.search(r"Grand total\s+(\d+)\s+(\d+|-)\s+(\d+|-)\s+(\d+|-)", text)
    assert match, f"no results table in pyinfra's output:\n{text[-3000:]}"
    return 0 if match.group(2) == "-" else int(match.group(2))


def changed_rows(text: str) -> list[str]:
    r"""Rows of pyinfra's results table whose operation changed something.

    Example:
        >>> changed_rows("    Models | Install model tiny-b   1   1   -   -\n"
        ...              "    Models | Install model tiny-a   1   -   -   1")
        ['Models | Install model tiny-b   1   1   -   -']
    """
    rows = re.findall(r"^\s*(.+?\s+\d+\s+(\d+|-)\s+(?:\d+|-)\s+(?:\d+|-))\s*$", text,
                      re.MULTILINE)  # fmt: skip
    return [row.strip() for row, changed in rows if changed != "-"]


def on_host(
    command: str, host: str = VLLM_HOST, stdin: str = "", timeout: float = 300
) -> subprocess.CompletedProcess:
    """A shell command on a running sandbox host (as root, over SSH); never raises on exit.

    + command: shell command to run there
    + host: sandbox host name (default: the shared vLLM host)
    + stdin: text fed to the command

    Example:
        on_host("hostname").stdout   # → 'e2e-vllm\\n'
    """
    return subprocess.run(
        sandbox.ssh_argv(host, command), input=stdin, capture_output=True, text=True,
        timeout=timeout, check=False,
    )  # fmt: skip


def prune_other_models(fleet: Path, env: dict[str, str] | None = None) -> None:
    """Remove the models that earlier modules left on the host (``fleet models prune --yes``).

    A deploy retires servers the fleet file no longer names, but never deletes model data;
    without this, a module that asks ``fleet drift`` for a clean host would see the models of
    the module that ran before it on the shared host.

    Example:
        prune_other_models(fleet)   # tiny-a and tiny-b gone, the fleet file's models stay
    """
    result = fleet_cli(fleet, "models", "prune", "--yes", "--fleet", str(fleet), env=env)
    assert result.returncode == 0, output(result)[-4000:]


def fleet_header(host: str = VLLM_HOST) -> str:
    """The start of an e2e fleet file: the CPU vLLM 0.32 defaults with a 1 GiB KV cache, the
    committed tiny model, and one sandbox host up to its ``servers:`` key (a module's servers
    follow, indented by 6).

    Example:
        >>> fleet_header("h").splitlines()[-3:]
        ['  h:', '    address: sandbox', '    servers:']
    """
    return f"""\
version: 1
defaults:
  vllm: {{version: "0.32.0", variant: cpu, cpu_kvcache_space_gib: 1}}
models:
  tiny-llama:
    url: "{TESTMODEL_URL}"
    sha256: "{TESTMODEL_SHA}"
hosts:
  {host}:
    address: sandbox
    servers:
"""
