#!/usr/bin/env bash
# Creates .venv with Python 3.11+ and installs LLM Dispatch with its test extras. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-}"
if [ -z "$PY" ]; then
  for candidate in python3.13 python3.12 python3.11 python3; do
    # A version manager's shim exists even for versions it does not have, and complains when run.
    if command -v "$candidate" >/dev/null 2>&1 \
      && "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 11))' >/dev/null 2>&1; then
      PY="$candidate"; break
    fi
  done
fi
[ -n "$PY" ] || { echo "LLM Dispatch needs Python 3.11 or newer" >&2; exit 1; }
[ -x .venv/bin/python ] || "$PY" -m venv .venv
stamp=.venv/.installed-$(sha1sum pyproject.toml | cut -c1-12)
if [ ! -f "$stamp" ]; then
  .venv/bin/python -m pip install -q --upgrade pip
  # setuptools warns on every editable install that same-named folders shadow the package: they are it.
  PYTHONWARNINGS="ignore:Editable installation" .venv/bin/python -m pip install -q -e '.[test]'
  touch "$stamp"
fi
