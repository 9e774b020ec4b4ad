#!/usr/bin/env bash
# Install what the tests need, then run all of them: lint, unit tests, and the end-to-end
# lifecycle on a sandbox host (up → deploy → deploy again with zero changes → verify → down).
set -uo pipefail
cd "$(dirname "$0")/.."

scripts/install.sh || exit 1
scripts/install-vllm.sh || exit 1
# vLLM's own code on the control machine: its flag parser, `vllm bench serve`, its KV log.
export FLEET_VLLM_PYTHON="$PWD/.venv-vllm/bin/python" VLLM_PYTHON="$PWD/.venv-vllm/bin/python"
echo "==> ruff"
.venv/bin/ruff check . || exit 1
echo "==> pytest"
.venv/bin/python -m pytest --durations=10 "$@"
status=$?
if [[ $status -eq 5 ]]; then
    echo "pytest collected no tests: that is a failure, not a pass" >&2
    exit 1
fi
exit $status
