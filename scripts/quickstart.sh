#!/usr/bin/env bash
# The main job on the default fleet (inventory/sandbox.yaml), from a fresh machine, as root:
# install → check the fleet file → serve the model archive → start the sandbox host →
# deploy (pyinfra) → verify (testinfra) → ask the served model for a completion.
set -euo pipefail
cd "$(dirname "$0")/.."
export FLEET="${FLEET:-inventory/sandbox.yaml}"

scripts/install.sh
fleet=.venv/bin/fleet
$fleet check "$FLEET"
$fleet modelserver start
$fleet sandbox up "$FLEET"
.venv/bin/pyinfra -y inventory.py deploy.py
$fleet verify "$FLEET" -q
$fleet complete "$FLEET" --prompt "The capital of France is"
