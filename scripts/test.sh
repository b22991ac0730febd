#!/usr/bin/env bash
# The tests: set up .venv if needed, lint and type-check, then run the default (fast) suite. Extra args go to pytest,
# e.g. `scripts/test.sh -m slow` for the slow tests.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# Lint first, and type-check beside the tests (configured in pyproject.toml): any finding fails the run.
# mypy runs while pytest does (a cold mypy is a minute of one core, which the tests' workers leave idle
# when they wait on each other's proofs and at the end), and its findings are printed after the tests.
.venv/bin/python -m ruff check --quiet .
mypy_log=$(mktemp)
trap 'rm -f "$mypy_log"' EXIT
.venv/bin/python -m mypy >"$mypy_log" 2>&1 &
mypy_pid=$!
export XLA_FLAGS="${XLA_FLAGS:---xla_force_host_platform_device_count=8}"
# Two worker processes by default (EQSAT_TEST_WORKERS=N to change; `-n 0` after it runs in one process).
tests=0
.venv/bin/python -m pytest -n "${EQSAT_TEST_WORKERS:-2}" "$@" || tests=$?
mypy=0
wait "$mypy_pid" || mypy=$?
cat "$mypy_log" >&2
[ "$mypy" -eq 0 ] || echo "mypy failed (exit $mypy)" >&2
[ "$tests" -eq 0 ] || exit "$tests"  # pytest's own status (1 failed, 2 interrupted, 5 nothing collected)
exit "$mypy"
