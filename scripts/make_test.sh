#!/usr/bin/env bash
# `make test`: lint, then mypy in the background while pytest runs the whole suite in parallel
# processes (PYTEST_WORKERS, pytest-xdist); every step runs even when one fails, and the last line
# says how long it all took. Arguments go to pytest.
set -uo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
failed=()
make --no-print-directory lint || failed+=(lint)
types_log=$(mktemp)
trap 'rm -f "$types_log"' EXIT
make --no-print-directory types >"$types_log" 2>&1 &
types_pid=$!
make --no-print-directory unit PYTEST_WORKERS="${PYTEST_WORKERS:-4}" PYTEST_ARGS="$*" || failed+=(pytest)
wait "$types_pid" || failed+=(mypy)
cat "$types_log"
elapsed=$(($(date +%s) - start))
if [ ${#failed[@]} -eq 0 ]; then
  printf 'make test: passed in %dm%02ds\n' $((elapsed / 60)) $((elapsed % 60))
else
  printf 'make test: FAILED (%s) in %dm%02ds\n' "${failed[*]}" $((elapsed / 60)) $((elapsed % 60))
  exit 1
fi
