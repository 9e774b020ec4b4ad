#!/usr/bin/env bash
# Install everything vllm-fleet needs on a Debian/Ubuntu control machine (as root):
# the container tools for sandbox hosts, an ssh client, and the Python venv with the tool.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v systemd-nspawn >/dev/null || need_apt+=(systemd-container)
command -v mmdebstrap >/dev/null || need_apt+=(mmdebstrap)
command -v ssh >/dev/null || need_apt+=(openssh-client)
command -v ss >/dev/null || need_apt+=(iproute2)
command -v gpg >/dev/null || need_apt+=(gnupg)
# promtool (Debian's prometheus package) checks and unit-tests the rendered alert rules
command -v promtool >/dev/null || need_apt+=(prometheus)
python3 -c 'import ensurepip' 2>/dev/null || need_apt+=(python3-venv)
if ((${#need_apt[@]})); then
    echo "==> apt-get install ${need_apt[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi
# Only promtool is needed here: where systemd runs, Debian's package also starts a server (9090).
if [[ " ${need_apt[*]} " == *" prometheus "* && -d /run/systemd/system ]]; then
    systemctl disable --now prometheus.service prometheus-node-exporter.service \
        >/dev/null 2>&1 || true
fi

if [[ ! -x .venv/bin/python ]]; then
    echo "==> creating .venv"
    python3 -m venv .venv
fi
echo "==> pip install -e .[dev]"
.venv/bin/pip install --quiet --disable-pip-version-check -e '.[dev]' 2>&1 \
    | grep -v "^WARNING: Location" || true
.venv/bin/python -c 'import cli.main, pyinfra, testinfra' \
    || { echo "install failed: the venv cannot import vllm-fleet" >&2; exit 1; }
