"""Fixtures of the Lua/Python fingerprint checks (test_fingerprint_identity, test_properties):
one small nginx with the fingerprint's test-only locations per module, loaded with the
golden vectors' mask patterns."""

from __future__ import annotations

import json

import pytest

from tests.support.fp_nginx import VECTORS, FpNginx, write_patterns
from zccp.cache.mask_apply import MaskSet
from zccp.cache.mask_store import load_masks


@pytest.fixture(scope="module")
def vectors() -> dict:
    return json.loads(VECTORS.read_text())


@pytest.fixture(scope="module")
def ngx(tmp_path_factory, vectors):
    root = tmp_path_factory.mktemp("fp_nginx")
    patterns = root / "mask_patterns.lua"
    write_patterns(patterns, [(m["name"], m["pattern"], m["replacement"]) for m in vectors["masks"]])
    srv = FpNginx(root, patterns, root / "mask_patterns.last_good.lua")
    srv.start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def masks(ngx) -> MaskSet:
    return load_masks(ngx.patterns, ngx.last_good)
