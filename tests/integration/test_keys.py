"""API keys (auth.mode: keys) through the real nginx, engine and Redis: `zccp-keys` makes
them (only their hash is stored), nginx verifies them before any slot is claimed, the
official SDKs raise their typed errors, the key's tenant is the cache's, its models are
enforced, and revocation holds on two stacks sharing one Redis within auth.cache_ttl_s."""

from __future__ import annotations

import time

import anthropic
import openai
import pytest
import redis

from tests.support.cache_requests import NULL, eventually, req
from tests.support.keys_helpers import keys_cli, status

TTL = 1          # auth.cache_ttl_s in these stacks: the revocation bound
AUTH = {"mode": "keys", "cache_ttl_s": TTL, "negative_ttl_s": 1}


@pytest.fixture
def kstack(make_stack):
    return make_stack({"model": NULL, "auth": AUTH}, with_redis=True)


def test_keys_are_required_and_refused_in_each_apis_shape(kstack):
    s = kstack
    body = {"anthropic": req("anthropic", [{"role": "user", "content": "hi"}]),
            "openai": req("openai", [{"role": "user", "content": "hi"}])}
    for api in ("anthropic", "openai"):
        for headers in ({}, {"x_api_key": "zk_nope"}, {"authorization": "Bearer zk_nope"}, {"x_api_key": ""}):
            r = status(s, api, body[api], **headers)
            assert r.status_code == 401, (api, headers, r.text)
            if api == "anthropic":
                assert r.json()["type"] == "error" and r.json()["error"]["type"] == "authentication_error"
            else:
                assert r.json()["error"]["code"] == "invalid_api_key"
    k = keys_cli(s, "create", "--tenant", "acme")
    assert k["key"].startswith("zk_") and k["tenant"] == "acme"
    # only the hash is stored: the secret appears nowhere in Redis
    rc = redis.Redis.from_url(s.cfg.cache.redis_url)
    assert not any(k["key"].encode() in (rc.dump(n) or b"") for n in rc.keys("zccp:auth:*"))
    assert status(s, "anthropic", body["anthropic"], x_api_key=k["key"]).status_code == 200
    assert status(s, "openai", body["openai"], authorization=f"Bearer {k['key']}").status_code == 200
    # an empty x-api-key is no key: the Bearer token is used
    assert status(s, "openai", body["openai"], x_api_key="", authorization=f"Bearer {k['key']}").status_code == 200
    # the other endpoints want a key too; /health does not
    assert s.client().post("/v1/messages/count_tokens", json={"model": "zccp-tiny", "messages": []}).status_code == 401
    assert s.client().get("/v1/models").status_code == 401
    assert s.client().get("/health").status_code == 200
    s.assert_no_leaks()


def test_the_sdks_raise_their_typed_errors(kstack):
    s = kstack
    with pytest.raises(anthropic.AuthenticationError):
        anthropic.Anthropic(base_url=s.base_url, api_key="zk_wrong", max_retries=0).messages.create(
            model="zccp-tiny", max_tokens=8, messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=s.base_url + "/v1", api_key="zk_wrong", max_retries=0).chat.completions.create(
            model="zccp-tiny", max_tokens=8, messages=[{"role": "user", "content": "hi"}])
    k = keys_cli(s, "create", "--tenant", "acme", "--model", "zccp-other")
    with pytest.raises(anthropic.NotFoundError):
        anthropic.Anthropic(base_url=s.base_url, api_key=k["key"], max_retries=0).messages.create(
            model="zccp-tiny", max_tokens=8, messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(openai.NotFoundError) as e:
        openai.OpenAI(base_url=s.base_url + "/v1", api_key=k["key"], max_retries=0).chat.completions.create(
            model="zccp-tiny", max_tokens=8, messages=[{"role": "user", "content": "hi"}])
    assert e.value.code == "model_not_found"
    ok = keys_cli(s, "create", "--tenant", "acme", "--model", "zccp-tiny")
    msg = anthropic.Anthropic(base_url=s.base_url, api_key=ok["key"], max_retries=0).messages.create(
        model="zccp-tiny", max_tokens=8, messages=[{"role": "user", "content": "hi"}])
    assert msg.content[0].type == "text"
    out = openai.OpenAI(base_url=s.base_url + "/v1", api_key=ok["key"], max_retries=0).chat.completions.create(
        model="zccp-tiny", max_tokens=8, messages=[{"role": "user", "content": "hi"}])
    assert out.choices[0].message.role == "assistant"


def test_the_tenant_is_the_keys_tenant(kstack):
    s = kstack
    a1 = keys_cli(s, "create", "--tenant", "acme")["key"]
    a2 = keys_cli(s, "create", "--tenant", "acme")["key"]
    b = keys_cli(s, "create", "--tenant", "globex")["key"]
    body = req("anthropic", [{"role": "user", "content": "Status of order #123456789, please"}])
    assert status(s, "anthropic", body, x_api_key=a1).headers["x-zccp-cache"] == "MISS"
    assert eventually(s, "anthropic", body, x_api_key=a2) == "HIT"           # another key, the same tenant
    assert status(s, "anthropic", body, x_api_key=b).headers["x-zccp-cache"] == "MISS"


def test_expiry_revocation_and_rotation_on_two_stacks_sharing_redis(make_stack):
    a = make_stack({"model": NULL, "auth": AUTH}, with_redis=True)
    b = make_stack({"model": NULL, "auth": AUTH, "cache": {"enabled": True, "redis_url": a.cfg.cache.redis_url}})
    body = req("anthropic", [{"role": "user", "content": "hi"}])
    k = keys_cli(a, "create", "--tenant", "acme")
    # 6 s: the four requests below must all come before it expires, on a loaded host too
    short = keys_cli(a, "create", "--tenant", "acme", "--expires-in", "6s")
    short_end = time.monotonic() + 6
    for s in (a, b):
        assert status(s, "anthropic", body, x_api_key=k["key"]).status_code == 200
        assert status(s, "anthropic", body, x_api_key=short["key"]).status_code == 200
    listed = {e["id"]: e for e in keys_cli(a, "list")}
    assert listed[k["id"]]["status"] == "active" and "key" not in listed[k["id"]]
    keys_cli(a, "revoke", k["id"])
    # past the revocation bound (auth.cache_ttl_s = 1) and the short key's expiry
    time.sleep(max(TTL, short_end - time.monotonic()) + 0.2)
    for s in (a, b):
        assert status(s, "anthropic", body, x_api_key=k["key"]).status_code == 401
        assert status(s, "anthropic", body, x_api_key=short["key"]).status_code == 401
    assert {e["id"]: e for e in keys_cli(a, "list")}[k["id"]]["status"] == "revoked"
    # rotation: a new secret for the same key id; the old one is refused (no grace)
    c = keys_cli(a, "create", "--tenant", "acme")
    assert status(a, "anthropic", body, x_api_key=c["key"]).status_code == 200
    new = keys_cli(a, "rotate", c["id"])
    assert new["id"] == c["id"] and new["key"] != c["key"]
    time.sleep(TTL + 0.2)
    for s in (a, b):
        assert status(s, "anthropic", body, x_api_key=c["key"]).status_code == 401
        assert status(s, "anthropic", body, x_api_key=new["key"]).status_code == 200
    a.assert_no_leaks()
    b.assert_no_leaks()


def test_the_admin_api_manages_the_same_keys(kstack):
    s = kstack
    adm = s.admin_client()
    r = adm.post("/v1/zccp/keys", json={"tenant": "initech", "models": ["zccp-tiny"], "limits": {"rpm": 5}})
    assert r.status_code == 201, r.text
    made = r.json()
    assert made["key"].startswith("zk_") and made["id"].startswith("key_")
    body = req("anthropic", [{"role": "user", "content": "hi"}])
    assert status(s, "anthropic", body, x_api_key=made["key"]).status_code == 200
    # the CLI sees it (and never its secret); the API lists what the CLI made
    listed = {e["id"]: e for e in keys_cli(s, "list")}
    assert listed[made["id"]]["tenant"] == "initech" and listed[made["id"]]["limits"] == {"rpm": 5}
    cli = keys_cli(s, "create", "--tenant", "initech")
    api_list = {e["id"]: e for e in adm.get("/v1/zccp/keys", params={"tenant": "initech"}).json()}
    assert set(api_list) == {made["id"], cli["id"]} and all("key" not in e for e in api_list.values())
    assert adm.post("/v1/zccp/keys", json={"tenant": "bad tenant!"}).status_code == 400
    # rotate and revoke through the API
    rot = adm.post(f"/v1/zccp/keys/{made['id']}/rotate").json()
    assert rot["id"] == made["id"] and rot["key"] != made["key"]
    assert adm.post(f"/v1/zccp/keys/{cli['id']}/revoke").json()["status"] == "revoked"
    time.sleep(TTL + 0.2)
    assert status(s, "anthropic", body, x_api_key=made["key"]).status_code == 401
    assert status(s, "anthropic", body, x_api_key=rot["key"]).status_code == 200
    assert status(s, "anthropic", body, x_api_key=cli["key"]).status_code == 401
    # never on the public listener
    assert s.client().post("/v1/zccp/keys", json={"tenant": "x"}).status_code == 404
