#!/usr/bin/env bash
# One command for the tests: sets up .venv and Chromium for the browser test, lints, runs the suite.
# Uses the embedded Valkey unless VALKEY_URL is set, SQLite unless DATABASE_URL is set.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
if [ ! -x /usr/bin/chromium ]; then
  if [ "$(id -u)" = 0 ]; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
      || echo "warning: could not install chromium; the browser test will fail" >&2
  else
    echo "warning: /usr/bin/chromium is missing (apt-get install chromium); the browser test will fail" >&2
  fi
fi
.venv/bin/ruff check .
.venv/bin/mypy
# Two pytest-xdist workers, one test file each at a time (files share module fixtures such as the
# ingress stack); each worker has its own embedded Valkey, database and temporary directories.
# `-n 0` in the arguments runs the suite in one process (bench/RESULTS.md, "CI time, session 6").
exec .venv/bin/python -m pytest -n 2 --dist loadfile "$@"
