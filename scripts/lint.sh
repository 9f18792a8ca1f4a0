#!/usr/bin/env bash
# The first stage of CI, seconds long: ruff (E, F, B) on every Python file, mypy on the
# engine, luacheck on the Lua modules. Needs the venv from scripts/setup.sh (lint extra)
# and Debian's lua-check.
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/ruff check .
.venv/bin/mypy
luacheck --quiet lua
