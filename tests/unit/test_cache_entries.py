"""Cache entries, placement and purge requests (Python only; the live behaviour is in
tests/integration/test_cache*.py). Entries read back from Redis are input: malformed
ones are misses, never crashes."""

from __future__ import annotations

import pytest

from zccp.cache.answer import CachedAnswer, literals_in
from zccp.cache.fp.csf import estimate_jaccard as jaccard_estimate
from zccp.cache.keys import CacheKeys
from zccp.cache.purge import PurgeRequest, parse_purge
from zccp.cache.scope import ANON, SHARED, hash_tag, owner_of, place, tenant_digest

T1, T2 = tenant_digest("sk-one"), tenant_digest("sk-two")
P = b"p" * 32


def test_round_trip():
    a = CachedAnswer("héllo ann@north.com", "end_turn", None, 3, (6, 13), 1.5, ("ann@north.com",))
    assert CachedAnswer.from_json(a.to_json()) == a
    b = CachedAnswer("héllo", "end_turn", None, 3, (2, 3), 1.5)
    assert CachedAnswer.from_json(b.to_json()) == b


@pytest.mark.parametrize("raw", [
    b"", b"not json", b"[]", b'{"text": 1}',
    b'{"text":"ab","stop_reason":"bogus","stop_sequence":null,"output_tokens":1,"deltas":[2],"created":0,"literals":[]}',
    b'{"text":"ab","stop_reason":"end_turn","stop_sequence":null,"output_tokens":1,"deltas":[5],"created":0,"literals":[]}',
    b'{"text":"ab","stop_reason":"end_turn","stop_sequence":null,"output_tokens":"x","deltas":[2],"created":0,"literals":[]}',
    b'{"text":"ab","stop_reason":"end_turn","stop_sequence":null,"output_tokens":1,"deltas":[2],"created":0}',
    b'{"text":"ab","stop_reason":"end_turn","stop_sequence":null,"output_tokens":1,"deltas":[2],"created":0,"literals":[1]}',
    b'{"text":"ab","stop_reason":"end_turn","stop_sequence":null,"output_tokens":1,"deltas":[2],"created":0,"literals":[""]}',
])
def test_malformed_entries_are_misses(raw):
    assert CachedAnswer.from_json(raw) is None


def test_the_guard_needs_every_carried_value_in_the_new_request():
    text = "Dear ann@north.com, invoice 123456789 is paid."
    lits = literals_in(text, (b"ann@north.com", b"123456789", b"2024-05-01T10:00:00Z", b"\xff\xfe"))
    assert lits == ("ann@north.com", "123456789")          # values the text does not carry are not kept
    a = CachedAnswer(text, "end_turn", None, 9, (len(text),), 0.0, lits)
    # the guard compares the values the masks replaced in the new request, nothing else of its body
    assert a.leaks_to((b"ann@north.com", b"123456789")) is None
    assert a.leaks_to((b"bob@south.org", b"987654321")) == "ann@north.com"
    assert a.leaks_to((b"ann@north.com", b"987654321")) == "123456789"
    assert a.leaks_to((b"bob@south.org ann@north.com 123456789",)) == "ann@north.com"   # not a substring search
    assert CachedAnswer("Done.", "end_turn", None, 1, (5,), 0.0).leaks_to(()) is None


def test_placement_by_scope_mode():
    # tenant (the default): everything is the tenant's, unmasked or not
    for masked in (False, True):
        p = place(P, T1, masked=masked, mode="tenant")
        assert p.lookup_owners == (owner_of(T1),) and p.store_owner == p.near_owner == owner_of(T1)
        assert not p.shared
    # shared_exact (opt-in): unmasked answers are shared, masked ones and every near index are the tenant's
    p = place(P, T1, masked=False, mode="shared_exact")
    assert p.lookup_owners == (SHARED,) and p.store_owner == SHARED and p.near_owner == owner_of(T1) and p.shared
    # ... but never read by a no-store request (no probe of what others sent)
    p = place(P, T1, masked=False, mode="shared_exact", no_store=True)
    assert p.lookup_owners == () and p.near_read and not p.read_shared
    assert not place(P, T1, masked=True, mode="global", no_store=True).near_read
    p = place(P, T1, masked=True, mode="shared_exact")
    assert p.lookup_owners == (owner_of(T1),) and p.store_owner == p.near_owner == owner_of(T1) and not p.shared
    assert place(P, None, masked=True, mode="tenant").store_owner == ANON   # no tenant: the anonymous one
    assert owner_of(T1) != owner_of(T2) != ANON
    # isolated: everything is the tenant's; global: everything is shared
    p = place(P, T2, masked=False, mode="isolated")
    assert p.lookup_owners == (owner_of(T2),) and p.store_owner == p.near_owner == owner_of(T2)
    p = place(P, T2, masked=True, mode="global")
    assert p.lookup_owners == (SHARED,) and p.store_owner == p.near_owner == SHARED


def test_every_key_of_a_request_shares_one_hash_tag():
    p = place(P, T1, masked=False, mode="tenant")
    keys = [p.key(o, "e", "ab" * 32) for o in p.lookup_owners] + [p.key(p.near_owner, "n", "cd" * 32)]
    keys.append(p.key(p.near_owner, "s", "ab" * 32))
    tags = {k[k.index("{") + 1:k.index("}")] for k in keys}
    assert tags == {hash_tag(P)} and all(k.startswith("zccp:v2:{") for k in keys)
    assert hash_tag(b"q" * 32) != hash_tag(P)


def test_near_requires_a_full_signature():
    p = place(P, None, False, "tenant")
    assert not CacheKeys(b"x" * 32, P, (), (), False, None, p).near_ok
    assert CacheKeys(b"x" * 32, P, tuple(range(16)), tuple(range(128)), False, None, p).near_ok
    assert jaccard_estimate(tuple(range(128)), tuple(range(128))) == 1.0
    assert jaccard_estimate(tuple(range(128)), tuple(range(1, 129))) == 0.0


def test_purge_requests():
    assert parse_purge({"all": True}) == PurgeRequest("all")
    assert parse_purge({"all": True}).patterns == ["zccp:*"]
    assert parse_purge({"scope": "shared"}).patterns == ["zccp:v2:{*}:shared:*"]
    assert parse_purge({"scope": "anonymous"}).patterns == ["zccp:v2:{*}:anon:*"]
    assert parse_purge({"tenant": "sk-one"}) == PurgeRequest("scope", T1.hex())
    assert parse_purge({"scope": T1.hex().upper()}).patterns == [f"zccp:v2:{{*}}:{owner_of(T1)}:*"]
    k = "AB" * 32
    assert parse_purge({"key": k}).patterns == ["zccp:v2:{*}:*:e:" + k.lower(), "zccp:v2:{*}:*:s:" + k.lower()]
    for bad, field in (([], "body"), ({}, "body"), ({"all": True, "key": k}, "body"), ({"all": 1}, "all"),
                       ({"scope": "mine"}, "scope"), ({"key": "abc"}, "key"), ({"tenant": ""}, "tenant"),
                       ({"everything": True}, "everything")):
        with pytest.raises(ValueError, match=f"^{field}:"):
            parse_purge(bad)
