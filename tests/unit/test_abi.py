"""The ABI: header sizes, the documented tables, and the same header in LuaJIT."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from zccp.transport.abi import HEADER_PATH, SlotLayout, const, ffi

ROOT = Path(__file__).resolve().parents[2]
STRUCTS = ["zccp_control", "zccp_slot_header", "zccp_slot_meta", "zccp_slot_signature", "zccp_slot_request",
           "zccp_ring", "zccp_notice", "zccp_l1_span"]


def _documented_tables() -> dict[str, list[tuple[int, int, str]]]:
    text = (ROOT / "shm_abi" / "README.md").read_text()
    tables: dict[str, list[tuple[int, int, str]]] = {}
    for block in re.split(r"^### ", text, flags=re.M)[1:]:
        m = re.match(r"struct (\w+)", block)
        if not m:
            continue
        rows = re.findall(r"^\| (\d+) \| (\d+) \| `(\w+)` \|", block, flags=re.M)
        tables[m.group(1)] = [(int(o), int(s), f) for o, s, f in rows]
    return tables


@pytest.mark.parametrize("name", STRUCTS)
def test_documented_table_matches_the_header(name):
    doc = _documented_tables()[name]
    actual = [(f.offset, ffi.sizeof(f.type), fname) for fname, f in ffi.typeof(f"struct {name}").fields]
    assert doc == actual


def test_promised_sizes():
    assert ffi.sizeof("struct zccp_control") == const("ZCCP_CONTROL_SIZE") == 4096
    assert ffi.sizeof("struct zccp_slot_header") == const("ZCCP_SLOT_HEADER_SIZE") == 128
    assert ffi.sizeof("struct zccp_slot_meta") == const("ZCCP_SLOT_META_SIZE") == 256
    assert const("ZCCP_SLOT_MAGIC") == 0xCAFEBABE


def test_header_has_no_macros_or_includes():
    text = HEADER_PATH.read_text()
    assert not re.search(r"^\s*#", text, flags=re.M)


def test_luajit_computes_the_same_layout():
    # required (nginx's LuaJIT reads this header): fail, never skip, when it is missing
    assert shutil.which("luajit"), "standalone luajit not installed: run scripts/setup.sh (luajit2)"
    fields = []
    for name in STRUCTS:
        for fname, f in ffi.typeof(f"struct {name}").fields:
            fields.append((name, fname, f.offset))
    script = f"local ffi=require'ffi'; ffi.cdef(io.open('{HEADER_PATH}'):read('*a'))\n" + "\n".join(
        f"io.write(ffi.offsetof('struct {s}','{f}'),' ')" for s, f, _ in fields
    ) + "\nio.write(ffi.C.ZCCP_SLOT_MAGIC)"
    out = subprocess.run(["luajit", "-e", script], capture_output=True, text=True, check=True)
    *offsets, magic = out.stdout.split()
    assert [int(o) for o in offsets] == [off for _, _, off in fields]
    assert int(magic) == 0xCAFEBABE


def test_layout_regions_are_page_aligned_and_disjoint():
    lay = SlotLayout.build(4, 1 << 20, 256 << 10, 64 << 10)
    assert lay.payload_offset == 4096
    assert lay.tokens_offset == lay.payload_offset + lay.payload_cap
    assert lay.response_offset == lay.tokens_offset + lay.tokens_cap * 4
    assert lay.response_offset + lay.response_cap == lay.slot_size
    for off in (lay.payload_offset, lay.tokens_offset, lay.response_offset):
        assert off % 4096 == 0
    with pytest.raises(ValueError):
        SlotLayout.build(4, 1 << 20, 1000, 64 << 10)
    with pytest.raises(ValueError):
        SlotLayout.build(4, 64 << 10, 32 << 10, 32 << 10)
