#!/usr/bin/env bash
# The README's test command: install what is missing, then run every test with the
# checkout's venv. The tests start their own nginx, engine and redis on free loopback ports.
# Two pytest-xdist workers, each taking whole files (--dist loadfile: a module's own stack
# fixtures start once, and its tests run in their order): one process and its stacks keep
# about one core busy, two keep a 2-core machine's both. Arguments come after and win:
# `-n 0` runs in one process, `-n 4` in four.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m pytest tests -n 2 --dist loadfile "$@"
