"""Prints the requirements the wheelhouse lacks for the image's Python, one per line.

pip download evaluates environment markers with the Python that runs it, not the
target's (`redis` needs `async-timeout` only below Python 3.11.3: Debian 12 has 3.11.2).
This walks the requirement graph through the wheels' metadata with the image's
markers; build-wheelhouse.sh downloads what it prints until nothing is missing.

usage: wheelhouse_missing.py WHEEL_DIR REQUIREMENT...
"""

import re
import sys
import zipfile
from collections import defaultdict
from pathlib import Path

try:
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name, parse_wheel_filename
except ImportError:  # pip always vendors it
    from pip._vendor.packaging.requirements import Requirement
    from pip._vendor.packaging.utils import canonicalize_name, parse_wheel_filename

# Debian 12's python3 in the image (Dockerfile, FROM debian:bookworm-slim), x86-64.
TARGET = {
    "python_version": "3.11", "python_full_version": "3.11.2", "implementation_version": "3.11.2",
    "implementation_name": "cpython", "platform_python_implementation": "CPython",
    "os_name": "posix", "sys_platform": "linux", "platform_system": "Linux",
    "platform_machine": "x86_64", "platform_release": "", "platform_version": "",
}


def wheels(directory: Path) -> dict[str, list[Path]]:
    found = defaultdict(list)
    for w in directory.glob("*.whl"):
        name, version, _, _ = parse_wheel_filename(w.name)
        found[name].append((version, w))
    return {n: [w for _, w in sorted(vs, reverse=True)] for n, vs in found.items()}


def requires(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if re.fullmatch(r"[^/]+\.dist-info/METADATA", n))
        text = z.read(meta).decode("utf-8", "replace").split("\n\n", 1)[0]
    return [line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("Requires-Dist:")]


def missing(directory: Path, top: list[str]) -> list[str]:
    have = wheels(directory)
    todo = [(Requirement(r), "") for r in top]
    seen, out = set(), []
    while todo:
        req, extra = todo.pop()
        if req.marker and not req.marker.evaluate({**TARGET, "extra": extra}):
            continue
        name = canonicalize_name(req.name)
        for ex in sorted(req.extras) or [""]:
            if (name, ex) in seen:
                continue
            seen.add((name, ex))
            match = [w for w in have.get(name, [])
                     if req.specifier.contains(parse_wheel_filename(w.name)[1], prereleases=True)]
            if not match:  # without its marker: pip would evaluate it for the host
                extras = f"[{','.join(sorted(req.extras))}]" if req.extras else ""
                out.append(f"{req.name}{extras}{req.specifier}")
                break
            todo += [(Requirement(r), ex) for r in requires(match[0])]
    return sorted(set(out))


if __name__ == "__main__":
    for line in missing(Path(sys.argv[1]), sys.argv[2:]):
        print(line)
