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
# pytest's exit status, where 5 (no tests collected) is a failure too.
verdict() {
    if [[ $1 -eq 5 ]]; then
        echo "pytest collected no tests${2:+ ($2)}: that is a failure, not a pass" >&2
        return 1
    fi
    return "$1"
}
if (($#)); then
    echo "==> pytest $*"
    .venv/bin/python -m pytest --durations=30 "$@"
    verdict $?
    exit
fi
# Three streams at once. What boots the shared vLLM hosts (tests/e2e and the sandbox's own
# tests: they share container names and ports, so one after another) mostly waits on containers
# and vLLM and is the long one; the stand-in GPU hosts (drift, plan from a host: their own host
# names, no vLLM, ports outside the shared blocks) run beside it; everything else (unit tests,
# doctests) fills the cores meanwhile. The background streams' output is printed whole when the
# long one is done; every stream's exit code counts (5, no tests, fails).
STANDIN_STREAM=(tests/e2e/test_drift_e2e.py tests/e2e/test_plan_from_host_e2e.py)
HOSTS_STREAM=(tests/e2e tests/unit/sandbox/test_sandbox.py)
rest_log=$(mktemp)
standin_log=$(mktemp)
trap 'rm -f "$rest_log" "$standin_log"' EXIT
echo "==> pytest (all but ${HOSTS_STREAM[*]}, in the background: its output follows)"
.venv/bin/python -m pytest --durations=30 "${HOSTS_STREAM[@]/#/--ignore=}" >"$rest_log" 2>&1 &
rest_pid=$!
echo "==> pytest ${STANDIN_STREAM[*]} (in the background: its output follows)"
.venv/bin/python -m pytest --durations=30 -p no:cacheprovider "${STANDIN_STREAM[@]}" \
    >"$standin_log" 2>&1 &
standin_pid=$!
echo "==> pytest ${HOSTS_STREAM[*]} (but ${STANDIN_STREAM[*]})"
.venv/bin/python -m pytest --durations=30 -p no:cacheprovider "${STANDIN_STREAM[@]/#/--ignore=}" \
    "${HOSTS_STREAM[@]}"
verdict $? "${HOSTS_STREAM[*]}"
hosts_status=$?
wait "$standin_pid"
standin_status=$?
echo "==> pytest ${STANDIN_STREAM[*]}"
cat "$standin_log"
verdict "$standin_status" "${STANDIN_STREAM[*]}"
standin_status=$?
wait "$rest_pid"
rest_status=$?
echo "==> pytest (all but ${HOSTS_STREAM[*]})"
cat "$rest_log"
verdict "$rest_status" "all but ${HOSTS_STREAM[*]}"
rest_status=$?
((hosts_status == 0)) || exit "$hosts_status"
((standin_status == 0)) || exit "$standin_status"
exit "$rest_status"
