"""zccp.lib.rendezvous and the fingerprint's route key, run by real nginx (the test-only locations
of tests/support/nginx/route_test.conf): the ranking every worker and host agrees on, and the
key that keeps a conversation's turns on one replica (docs/engines.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.fp_nginx import records, snippet_nginx

SNIPPET = Path(__file__).resolve().parents[1] / "support" / "nginx" / "route_test.conf"


@pytest.fixture(scope="module")
def ngx(tmp_path_factory):
    srv = snippet_nginx(tmp_path_factory.mktemp("route"), SNIPPET)
    yield srv
    srv.stop()


def rank(ngx, names, keys, usable=None):
    q = {"names": names, "keys": keys}
    if usable is not None:
        q["usable"] = usable
    return json.loads(ngx.post("/_route/rank", json.dumps(q).encode()))


KEYS = [f"conversation-{i}" for i in range(400)]


def test_rank_is_a_permutation_and_stable(ngx):
    names = ["a", "b", "c"]
    first = rank(ngx, names, KEYS)
    again = rank(ngx, names, KEYS)
    assert first == again
    for r in first["ranks"]:
        assert sorted(r) == names
    assert first["picks"] == [r[0] for r in first["ranks"]]


def test_keys_spread_over_members(ngx):
    tops = [r[0] for r in rank(ngx, ["replica-1", "replica-2"], KEYS)["ranks"]]
    share = tops.count("replica-1") / len(tops)
    assert 0.4 < share < 0.6, share


def test_removing_a_member_moves_only_its_keys(ngx):
    three = rank(ngx, ["a", "b", "c"], KEYS)["ranks"]
    two = rank(ngx, ["a", "b"], KEYS)["ranks"]
    moved = 0
    for r3, r2 in zip(three, two, strict=True):
        if r3[0] != "c":
            assert r2[0] == r3[0]          # a key c did not hold keeps its member
        else:
            assert r2[0] == r3[1]          # c's keys go to their second choice
            moved += 1
    assert 0 < moved < len(KEYS)


def test_pick_skips_unusable_members_in_rank_order(ngx):
    names = ["a", "b", "c"]
    out = rank(ngx, names, KEYS, usable=["b", "c"])
    for r, p in zip(out["ranks"], out["picks"], strict=True):
        assert p == [n for n in r if n != "a"][0]
    assert rank(ngx, names, KEYS[:3], usable=[])["picks"] == [None, None, None]


def _turns(api, system, first, n):
    """A conversation's n-th turn bodies: the same system and first user message, then
    alternating assistant and user turns."""
    msgs = [{"role": "user", "content": first}]
    bodies = []
    for t in range(n):
        if t:
            msgs = msgs + [{"role": "assistant", "content": f"answer {t}"}, {"role": "user", "content": f"more {t}"}]
        if api == "anthropic":
            body = {"model": "m", "max_tokens": 16, "system": system, "messages": msgs}
        else:
            body = {"model": "m", "messages": [{"role": "system", "content": system}, *msgs]}
        bodies.append((api, json.dumps(body).encode()))
    return bodies


def route_keys(ngx, items):
    lines = ngx.post("/_route/key", records(items, lambda it: it)).decode().splitlines()
    return [ln.split() for ln in lines]


@pytest.mark.parametrize("api", ["anthropic", "openai"])
def test_route_key_is_the_same_every_turn(ngx, api):
    out = route_keys(ngx, _turns(api, "You are terse.", "Tell me about tides.", 4))
    assert all(o[0] != "NIL" for o in out), out
    assert len({o[0] for o in out}) == 1          # one route key for the whole conversation
    assert len({o[1] for o in out}) == 4          # while the prefix key changes every turn
    assert {o[2] for o in out} == {"m"}


@pytest.mark.parametrize("api", ["anthropic", "openai"])
def test_route_key_tells_conversations_apart(ngx, api):
    items = [_turns(api, "You are terse.", "Tell me about tides.", 1)[0],
             _turns(api, "You are terse.", "Tell me about waves.", 1)[0],
             _turns(api, "You are verbose.", "Tell me about tides.", 1)[0]]
    keys = [o[0] for o in route_keys(ngx, items)]
    assert len(set(keys)) == 3
