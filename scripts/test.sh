#!/usr/bin/env bash
# The tests: set up .venv if needed, lint and type-check, then run the default (fast) suite. Extra args go to pytest,
# e.g. `scripts/test.sh -m slow` for the slow tests.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# Lint and type-check first (configured in pyproject.toml): any finding fails the run.
.venv/bin/python -m ruff check --quiet .
.venv/bin/python -m mypy
export XLA_FLAGS="${XLA_FLAGS:---xla_force_host_platform_device_count=8}"
# Two worker processes by default (EQSAT_TEST_WORKERS=N to change; `-n 0` after it runs in one process).
exec .venv/bin/python -m pytest -n "${EQSAT_TEST_WORKERS:-2}" "$@"
