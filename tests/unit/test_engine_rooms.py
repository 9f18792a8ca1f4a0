"""The rooms of engine/zccp (docs/ARCHITECTURE.md): at the top only the package's own
__init__ and the plain data every room passes; every folder a package (`pip install .`
finds packages by their __init__.py: a folder without one would be left out); a room's
__init__ says in one docstring what it holds, nothing else (no re-export: one path per
module). Read from the source, as a reviewer would; the first test proves the scan."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.support.checkout import REPO

ENGINE = REPO / "engine" / "zccp"
TOP = {"__init__.py", "shared_types.py"}
# config/__init__.py is config.yaml's loader itself (`from zccp.config import Config`)
ROOMS = ("transport", "prep", "serving", "observe", "process")


def violations(root: Path, rooms: tuple[str, ...] = ROOMS) -> list[str]:
    out = [f"{p.name} at the top of {root.name}/ (a module belongs in a room)"
           for p in sorted(root.glob("*.py")) if p.name not in TOP]
    for d in sorted(p for p in root.rglob("*") if p.is_dir() and p.name != "__pycache__"):
        if any(d.glob("*.py")) and not (d / "__init__.py").is_file():
            out.append(f"{d.relative_to(root)}/ has modules but no __init__.py")
    for room in rooms:
        init = root / room / "__init__.py"
        if not init.is_file():
            out.append(f"{room}/ is missing")
            continue
        body = ast.parse(init.read_text()).body
        if len(body) != 1 or ast.get_docstring(ast.Module(body=body, type_ignores=[])) is None:
            out.append(f"{room}/__init__.py is not one docstring")
    return out


def test_the_scan_finds_each_kind_of_violation(tmp_path: Path) -> None:
    root = tmp_path / "zccp"
    for d in ("serving", "loose", "prep"):
        (root / d).mkdir(parents=True)
    (root / "__init__.py").write_text('"""x"""\n')
    (root / "shared_types.py").write_text("")
    (root / "flow.py").write_text("")
    (root / "loose" / "m.py").write_text("")
    (root / "serving" / "__init__.py").write_text('"""The model thread."""\n')
    (root / "prep" / "__init__.py").write_text('"""Preparation."""\nfrom zccp.prep.flow import RequestFlow\n')
    assert violations(root, ("serving", "prep", "observe")) == [
        "flow.py at the top of zccp/ (a module belongs in a room)",
        "loose/ has modules but no __init__.py",
        "prep/__init__.py is not one docstring",
        "observe/ is missing",
    ]


def test_engine_zccp_keeps_its_rooms() -> None:
    assert violations(ENGINE) == []
