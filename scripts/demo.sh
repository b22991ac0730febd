#!/usr/bin/env bash
# The demo: set up .venv if needed, then optimize NasRNN end to end and print the JSON report.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/eqsat optimize nasrnn --json "$@"
