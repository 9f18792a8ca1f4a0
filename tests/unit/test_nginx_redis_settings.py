"""auth.redis_url as nginx's Redis client (zccp.lib.redis over lua-resty-redis and
lua-resty-redis-connector) gets it: Sentinel URLs are accepted and rendered with their
Sentinels, master name and Sentinel password; what the libraries cannot do (TLS, a Sentinel
user name) is refused naming the field."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from zccp.config import ConfigError, load_config
from zccp.ops.nginx_conf import _auth_settings, resolver_line


def cfg(tmp_path: Path, url: str):
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({"auth": {"mode": "keys", "redis_url": url, "timeout_ms": 300}}))
    return load_config(path)


def test_a_sentinel_url_renders_its_sentinels_master_and_passwords(tmp_path: Path) -> None:
    c = cfg(tmp_path, "redis+sentinel://app:s3cret@127.0.0.1:26379,10.0.0.2:26380/zccp-main/2"
                      "?sentinel_password=watch")
    out = tmp_path / "out"
    out.mkdir()
    s = _auth_settings(c, out)
    assert ('sentinels = { { host = "127.0.0.1", port = 26379 }, { host = "10.0.0.2", port = 26380 } }'
            in s), s
    assert 'master_name = "zccp-main"' in s and "db = 2" in s and "timeout_ms = 300" in s
    # the passwords are in owner-only files the rendered config names, never in it
    assert "watch" not in s and "s3cret" not in s and 'username = "app"' in s
    assert f'sentinel_password = require("zccp.lib.redis").read_secret("{out}/zccp_redis_sentinel_password")' in s
    assert f'password = require("zccp.lib.redis").read_secret("{out}/zccp_redis_password")' in s
    for name, secret in (("zccp_redis_password", "s3cret"), ("zccp_redis_sentinel_password", "watch")):
        assert (out / name).read_text() == secret and (out / name).stat().st_mode & 0o777 == 0o600
    assert "cluster = true" not in s and "host = " not in s.split("sentinels")[0]


def test_a_sentinel_named_by_host_gets_a_resolver(tmp_path: Path) -> None:
    resolv = tmp_path / "resolv.conf"
    resolv.write_text("nameserver 127.0.0.11\n")
    named = cfg(tmp_path, "redis+sentinel://10.0.0.1:26379,sentinel-b:26379/zccp-main/0")
    assert resolver_line(named, resolv).startswith("resolver 127.0.0.11 ")
    by_address = cfg(tmp_path, "redis+sentinel://10.0.0.1:26379,10.0.0.2:26379/zccp-main/0")
    assert resolver_line(by_address, resolv).startswith("#")


@pytest.mark.parametrize("url, message", [
    ("rediss://cache.example:6380/0", r"auth\.redis_url: nginx's Redis client \(lua-resty-redis 0\.27\) has no TLS"),
    ("rediss+cluster://a:7000", r"auth\.redis_url: nginx's Redis client .* has no TLS"),
    ("rediss+sentinel://a:26379/m/0", r"auth\.redis_url: nginx's Redis client .* has no TLS"),
    ("redis+sentinel://a:26379/m/0?sentinel_username=u&sentinel_password=p",
     r"auth\.redis_url: sentinel_username: .*password only"),
])
def test_what_the_libraries_cannot_do_is_refused_naming_the_field(tmp_path: Path, url: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        cfg(tmp_path, url)


def test_the_cache_alone_may_still_use_tls_and_a_sentinel_user(tmp_path: Path) -> None:
    # only nginx's client is limited: with keys off, cache.redis_url keeps every form
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({"cache": {"redis_url": "rediss+sentinel://a:26379/m/0?sentinel_username=u"}}))
    assert load_config(path).cache.redis_url.startswith("rediss+sentinel://")
