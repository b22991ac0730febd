#!/usr/bin/env bash
# Create .venv in the checkout with a Python >= 3.12 and install eqsat into it.
# Looks on PATH first, then in pyenv's versions; says what is missing if it finds none.
set -euo pipefail
cd "$(dirname "$0")/.."

usable() {  # prints the interpreter's path if it runs and is >= 3.12
  "$1" -c 'import sys; assert sys.version_info >= (3, 12); print(sys.executable)' 2>/dev/null
}

find_python() {
  local cand found
  for cand in python3.13 python3.12 python3 python; do
    if command -v "$cand" >/dev/null 2>&1 && found=$(usable "$cand"); then echo "$found"; return 0; fi
  done
  local root="${PYENV_ROOT:-$HOME/.pyenv}"
  if command -v pyenv >/dev/null 2>&1; then root=$(pyenv root 2>/dev/null || echo "$root"); fi
  for cand in $(ls -d "$root"/versions/3.1[2-9]* 2>/dev/null | sort -rV); do
    if [ -x "$cand/bin/python3" ] && found=$(usable "$cand/bin/python3"); then echo "$found"; return 0; fi
  done
  return 1
}

if [ -x .venv/bin/python ] && usable .venv/bin/python >/dev/null && [ -f .venv/.eqsat-installed ] \
   && [ .venv/.eqsat-installed -nt pyproject.toml ]; then
  exit 0
fi

if ! PY=$(find_python); then
  echo "eqsat needs Python >= 3.12 (egglog 14 requires it), and none was found." >&2
  echo "Looked on PATH (python3.13, python3.12, python3, python) and in pyenv's versions." >&2
  echo "Install one, e.g. 'pyenv install 3.12' or your system's python3.12 package, and rerun." >&2
  exit 1
fi
echo "Using $PY" >&2
if [ ! -x .venv/bin/python ] || ! usable .venv/bin/python >/dev/null; then
  rm -rf .venv
  "$PY" -m venv .venv
fi
# a pip that installs a pyproject project editable (PEP 660, pip >= 21.3) is all that is needed: a venv
# of Python >= 3.12 comes with one, so pip is upgraded only where it is older (saves a download per fresh CI run)
if ! .venv/bin/python -c 'import sys, pip; sys.exit(tuple(map(int, pip.__version__.split(".")[:2])) < (21, 3))' 2>/dev/null; then
  .venv/bin/python -m pip install --quiet --upgrade pip >&2
fi
.venv/bin/python -m pip install --quiet -e ".[test]" >&2
touch .venv/.eqsat-installed
