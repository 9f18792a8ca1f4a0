#!/usr/bin/env bash
# The first stage of CI, seconds long: ruff (E, F, B) on every Python file, mypy on the
# engine, luacheck on the Lua modules, and the size cap: no .py or .lua file over
# MAX_LINES lines in engine/, lua/, bench/, tests/ (a file that grows past it is split
# into modules with one job each). Needs the venv from scripts/setup.sh (lint extra)
# and Debian's lua-check.
set -euo pipefail
cd "$(dirname "$0")/.."
MAX_LINES=450
.venv/bin/ruff check .
.venv/bin/mypy
luacheck --quiet lua
over=$(find engine lua bench tests -type f \( -name '*.py' -o -name '*.lua' \) -print0 \
       | xargs -0 awk -v max="$MAX_LINES" 'FNR == 1 && NR > 1 && n > max { print prev ": " n " lines" }
                                            { prev = FILENAME; n = FNR }
                                            END { if (n > max) print prev ": " n " lines" }' | sort)
if [ -n "$over" ]; then
    echo "files over $MAX_LINES lines (split each into modules with one job):" >&2
    echo "$over" >&2
    exit 1
fi
