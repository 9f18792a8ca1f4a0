"""Prints the image's pip requirements, one per line, from pyproject.toml (the one list).

torch is pinned to --torch (the build chooses its source); --extras adds optional groups.
Runs on the host (wheelhouse) and in the image build, with nothing but the stdlib.
"""

import argparse
import re
import sys
import tomllib
from pathlib import Path

p = argparse.ArgumentParser()
p.add_argument("--pyproject", help="default: the checkout's pyproject.toml")
p.add_argument("--torch", required=True, help="torch version to pin")
p.add_argument("--extras", default="", help="comma-separated optional-dependency groups")
args = p.parse_args()

pyproject = Path(args.pyproject or Path(__file__).resolve().parents[2] / "pyproject.toml")
project = tomllib.loads(pyproject.read_text())["project"]
reqs = list(project["dependencies"])
for group in filter(None, args.extras.split(",")):
    try:
        reqs += project["optional-dependencies"][group]
    except KeyError:
        sys.exit(f"requirements.py: no optional-dependency group {group!r} in {pyproject}")
for r in reqs:
    name = re.match(r"[A-Za-z0-9._-]+", r).group(0)
    print(f"torch=={args.torch}" if name.lower() == "torch" else r)
