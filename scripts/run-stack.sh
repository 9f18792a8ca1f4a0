#!/usr/bin/env bash
# The README's first command: install what is missing, then run redis + engine +
# nginx on loopback with the built-in model (no downloads). Ctrl-C stops all three.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/zccp-stack up --config "${ZCCP_CONFIG:-config.yaml}" --run-dir .run
