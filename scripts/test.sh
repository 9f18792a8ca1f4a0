#!/usr/bin/env bash
# The README's test command: install what is missing, then run every test with the
# checkout's venv. The tests start their own nginx, engine and redis on free loopback ports.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m pytest tests "$@"
