#!/usr/bin/env bash
# One command for the demo: sets up .venv, then runs everything (dashboard on http://127.0.0.1:8000).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python manage.py demo "$@"
