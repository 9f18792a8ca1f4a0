"""nginx's Redis password (auth.redis_url's, docs/keys.md): the rendered nginx config, which
every local user may read, names an owner-only file that holds it, never the password;
nginx's master reads it at init, and keys and limits work against a real redis-server
that requires it (a request refused with a wrong password would be a 503, not a 200)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import pytest
import redis

from tests.support.cache_requests import NULL, req
from tests.support.harness import Stack
from tests.support.keys_helpers import keys_cli, status
from tests.support.redis_topologies import Node

PASSWORD = 'p@ss "word" {{x}} ;'   # characters a config line cannot carry as they are


@dataclass
class LockedNode(Node):
    """A redis-server that requires PASSWORD (requirepass)."""

    def client(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, password=PASSWORD, socket_timeout=5,
                           socket_connect_timeout=5)


@pytest.fixture
def locked(tmp_path: Path) -> Iterator[LockedNode]:
    n = LockedNode("locked", tmp_path / "redis", [f'requirepass "{PASSWORD.replace(chr(34), chr(92) + chr(34))}"'])
    try:
        yield n.start()   # type: ignore[misc]
    finally:
        if n.service is not None:
            n.service.stop()


def test_the_redis_password_is_in_an_owner_only_file_not_in_the_rendered_conf(locked: LockedNode, tmp_path: Path):
    with redis.Redis(host="127.0.0.1", port=locked.port) as anon:   # the server really asks for it
        with pytest.raises(redis.AuthenticationError):
            anon.ping()
    url = f"redis://:{quote(PASSWORD, safe='')}@127.0.0.1:{locked.port}/0"
    s = Stack(tmp_path / "a", {"model": NULL, "auth": {"mode": "keys", "redis_url": url, "cache_ttl_s": 1},
                               "cache": {"enabled": False}}).start()
    try:
        confs = [p for p in s.run_dir.rglob("*.conf") if p.is_file()]
        assert any(p.name == "zccp_http.conf" for p in confs), confs
        for p in confs:
            text = p.read_text(errors="replace")
            assert PASSWORD not in text and quote(PASSWORD, safe="") not in text, p
        secrets = list(s.run_dir.rglob("zccp_redis_password"))
        assert len(secrets) == 1 and secrets[0].read_text() == PASSWORD
        assert secrets[0].stat().st_mode & 0o777 == 0o600
        http_conf = next(p for p in confs if p.name == "zccp_http.conf").read_text()
        assert f'read_secret("{secrets[0]}")' in http_conf

        k = keys_cli(s, "create", "--tenant", "locked", "--concurrency", "2", "--rpm", "100")
        body = req("anthropic", [{"role": "user", "content": "hi"}])
        assert status(s, "anthropic", body, x_api_key="zk_nope").status_code == 401
        for _ in range(3):   # the key is found and the limits counted in the locked Redis
            r = status(s, "anthropic", body, x_api_key=k["key"], cache_control="no-store")
            assert r.status_code == 200, r.text
        with locked.client() as c:
            assert list(c.scan_iter(match="zccp:lim:{locked}*", count=1000))
        assert "runtime error" not in s.error_log()
    finally:
        s.stop()
