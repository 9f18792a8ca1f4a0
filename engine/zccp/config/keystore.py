"""API keys in Redis (docs/keys.md): what `zccp-keys` and the admin API write, what nginx
(lua/zccp/plugins/auth/keys.lua) reads.

A key is shown once, when it is made; only its SHA-256 is stored. The Redis layout is
lua/zccp/admin/key_layout.lua's (the one table nginx and this module read): the key's
record (JSON: id, tenant, models, expires_at, limits) under RECORD + its hash, which nginx
GETs (a missing key is an unknown one); INDEX, a hash of key id -> the record, its hash,
revoked_at (list, revoke); a tenant's own limits (over all its keys) under TENANT + its name.

A single host may also list keys in a file (auth.keys_file, the same records with their
hash, never the secret; `zccp-keys create --keys-file`), read by nginx at start and reload:

    {"keys": [{"sha256": "<hex>", "id": "key_1", "tenant": "acme", "limits": {"rpm": 60}}],
     "tenants": {"acme": {"limits": {"rpm": 600}}}}

Revoking deletes the record: every nginx stops accepting the key once its cached copy
expires (auth.cache_ttl_s). Rotating makes a new secret for the same id, tenant and limits;
the old one keeps working for `grace_s` (0: at once).
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import orjson

from zccp.config.lua_data import load_lua_data
from zccp.config.paths import lua_file

# The Redis layout's one source, shared with nginx (zccp.admin.key_layout, read as Lua there).
_LAYOUT = load_lua_data(lua_file("admin/key_layout.lua"))
RECORD: str = _LAYOUT["record"].decode()
INDEX: str = _LAYOUT["index"].decode()
TENANT: str = _LAYOUT["tenant"].decode()          # a tenant's limits, read with its keys
LIMIT_NAMES: tuple[str, ...] = tuple(n.decode() for n in _LAYOUT["limit_names"])
KEY_PREFIX = "zk_"
_TENANT = re.compile(r"[A-Za-z0-9._:@-]{1,128}")


def key_hash(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8", "surrogateescape")).hexdigest()


@dataclass(frozen=True)
class Limits:
    """Per key (docs/keys.md); 0: no limit."""
    rpm: int = 0               # requests per minute
    itpm: int = 0              # input tokens per minute
    otpm: int = 0              # output tokens per minute
    concurrency: int = 0       # requests in flight
    daily_tokens: int = 0      # input + output tokens per UTC day
    monthly_tokens: int = 0    # input + output tokens per UTC month

    def __post_init__(self) -> None:
        for name in LIMIT_NAMES:
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise ValueError(f"limits.{name}: expected an integer >= 0, got {v!r}")


@dataclass(frozen=True)
class KeyRecord:
    id: str
    tenant: str
    name: str = ""
    models: tuple[str, ...] = ()          # () : every model
    expires_at: float = 0.0               # unix time; 0: never
    created_at: float = 0.0
    limits: Limits = field(default_factory=Limits)
    hint: str = ""                        # the key's first characters, to recognise it in a list

    def to_json(self) -> bytes:
        d = asdict(self)
        d["models"] = list(self.models)
        d["limits"] = {k: v for k, v in d["limits"].items() if v}
        return orjson.dumps(d)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> KeyRecord:
        return cls(str(d["id"]), str(d["tenant"]), str(d.get("name", "")), tuple(d.get("models") or ()),
                   float(d.get("expires_at") or 0), float(d.get("created_at") or 0),
                   Limits(**{k: int(v) for k, v in (d.get("limits") or {}).items() if k in LIMIT_NAMES}),
                   str(d.get("hint", "")))


@dataclass(frozen=True)
class IndexEntry:
    record: KeyRecord
    hash: str
    revoked_at: float = 0.0
    old_hashes: tuple[str, ...] = ()      # rotated-out secrets still in their grace period

    def to_json(self) -> bytes:
        return orjson.dumps({"record": orjson.loads(self.record.to_json()), "hash": self.hash,
                             "revoked_at": self.revoked_at, "old_hashes": list(self.old_hashes)})

    @classmethod
    def from_json(cls, raw: bytes) -> IndexEntry:
        d = orjson.loads(raw)
        return cls(KeyRecord.from_dict(d["record"]), str(d["hash"]), float(d.get("revoked_at") or 0),
                   tuple(d.get("old_hashes") or ()))


def check_tenant(tenant: str) -> str:
    if not _TENANT.fullmatch(tenant):
        raise ValueError(f"tenant {tenant!r}: 1-128 of letters, digits and . _ : @ -")
    return tenant


class KeyStore:
    def __init__(self, redis: Any) -> None:
        self.redis = redis          # redis-py's async client for one server or a Cluster

    async def create(self, tenant: str, name: str = "", models: tuple[str, ...] = (), expires_at: float = 0.0,
                     limits: Limits | None = None) -> tuple[str, KeyRecord]:
        """A new key: (the secret, shown once; its record)."""
        check_tenant(tenant)
        kid = "key_" + secrets.token_hex(6)
        secret = KEY_PREFIX + secrets.token_urlsafe(32)
        rec = KeyRecord(kid, tenant, name, tuple(models), expires_at, time.time(), limits or Limits(),
                        secret[:8])
        await self._write(rec, secret, ())
        return secret, rec

    async def _write(self, rec: KeyRecord, secret: str, old: tuple[str, ...]) -> None:
        h = key_hash(secret)
        ttl = int(rec.expires_at - time.time()) + 60 if rec.expires_at else None
        await self.redis.set(RECORD + h, rec.to_json(), ex=ttl)
        await self.redis.hset(INDEX, rec.id, IndexEntry(rec, h, 0.0, old).to_json())

    async def get(self, kid: str) -> IndexEntry | None:
        raw = await self.redis.hget(INDEX, kid)
        return IndexEntry.from_json(raw) if raw else None

    async def list(self, tenant: str | None = None) -> list[IndexEntry]:
        raw = await self.redis.hgetall(INDEX)
        out = [IndexEntry.from_json(v) for v in raw.values()]
        return sorted((e for e in out if tenant is None or e.record.tenant == tenant),
                      key=lambda e: (e.record.tenant, e.record.created_at))

    async def revoke(self, kid: str) -> IndexEntry:
        e = await self.get(kid)
        if e is None:
            raise KeyError(kid)
        for h in (e.hash, *e.old_hashes):
            await self.redis.delete(RECORD + h)
        revoked = IndexEntry(e.record, e.hash, e.revoked_at or time.time(), ())
        await self.redis.hset(INDEX, kid, revoked.to_json())
        return revoked

    async def set_tenant_limits(self, tenant: str, limits: Limits) -> None:
        check_tenant(tenant)
        await self.redis.set(TENANT + tenant, orjson.dumps({"limits": {k: v for k, v in asdict(limits).items() if v}}))

    async def tenant_limits(self, tenant: str) -> Limits:
        raw = await self.redis.get(TENANT + check_tenant(tenant))
        d = orjson.loads(raw).get("limits", {}) if raw else {}
        return Limits(**{k: int(v) for k, v in d.items() if k in LIMIT_NAMES})

    async def rotate(self, kid: str, grace_s: int = 0) -> tuple[str, KeyRecord]:
        """A new secret for key `kid` (same id, tenant, models, limits); the old one works
        for grace_s more seconds (0: refused at once, within auth.cache_ttl_s)."""
        e = await self.get(kid)
        if e is None or e.revoked_at:
            raise KeyError(kid)
        secret = KEY_PREFIX + secrets.token_urlsafe(32)
        rec = KeyRecord(e.record.id, e.record.tenant, e.record.name, e.record.models, e.record.expires_at,
                        time.time(), e.record.limits, secret[:8])
        old: tuple[str, ...] = ()
        if grace_s > 0:
            await self.redis.expire(RECORD + e.hash, grace_s)
            old = (e.hash,)
        else:
            await self.redis.delete(RECORD + e.hash)
        await self._write(rec, secret, old)
        return secret, rec


_HEX = re.compile(r"[0-9a-f]{64}")
MAX_FILE_KEYS = 100_000


def load_keys_file(path: str) -> dict[str, Any]:
    """auth.keys_file, checked as nginx will read it (lua/zccp/plugins/auth/keys.lua): {"keys": [records
    with "sha256"], "tenants": {tenant: {"limits": {...}}}}. ValueError says what is wrong."""
    try:
        with open(path, "rb") as f:
            doc = orjson.loads(f.read())
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror}") from None
    except orjson.JSONDecodeError as exc:
        raise ValueError(f"{path}: not JSON: {exc}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("keys", []), list) \
            or not isinstance(doc.get("tenants", {}), dict):
        raise ValueError(f'{path}: expected {{"keys": [...], "tenants": {{...}}}}')
    if len(doc.get("keys", [])) > MAX_FILE_KEYS:
        raise ValueError(f"{path}: more than {MAX_FILE_KEYS} keys; keep them in Redis")
    for i, k in enumerate(doc.get("keys", [])):
        if not isinstance(k, dict) or not isinstance(k.get("sha256"), str) or not _HEX.fullmatch(k["sha256"]):
            raise ValueError(f"{path}: keys[{i}]: needs \"sha256\": the key's SHA-256, 64 lowercase hex digits")
        try:
            check_tenant(str(k.get("tenant", "")))
            KeyRecord.from_dict(k)
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"{path}: keys[{i}]: {exc}") from None
    for t, v in doc.get("tenants", {}).items():
        check_tenant(t)
        if not isinstance(v, dict) or not isinstance(v.get("limits", {}), dict):
            raise ValueError(f'{path}: tenants.{t}: expected {{"limits": {{...}}}}')
        Limits(**{k: int(n) for k, n in v.get("limits", {}).items() if k in LIMIT_NAMES})
    return doc


def add_to_keys_file(path: str, tenant: str, name: str = "", models: tuple[str, ...] = (),
                     expires_at: float = 0.0, limits: Limits | None = None) -> tuple[str, KeyRecord]:
    """A new key listed in the keys file at `path` (made if missing): (the secret, shown
    once; its record). nginx reads the file at start and reload (zccp-stack reload, HUP)."""
    check_tenant(tenant)
    try:
        doc = load_keys_file(path)
    except ValueError:
        try:
            open(path, "rb").close()
        except FileNotFoundError:
            doc = {"keys": [], "tenants": {}}
        else:
            raise
    kid = "key_" + secrets.token_hex(6)
    secret = KEY_PREFIX + secrets.token_urlsafe(32)
    rec = KeyRecord(kid, tenant, name, tuple(models), expires_at, time.time(), limits or Limits(), secret[:8])
    doc.setdefault("keys", []).append({"sha256": key_hash(secret), **orjson.loads(rec.to_json())})
    doc.setdefault("tenants", {})
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(orjson.dumps(doc, option=orjson.OPT_INDENT_2))
    os.replace(tmp, path)
    return secret, rec


USAGE_FIELDS = ("requests", "input_tokens", "output_tokens", "cache_hits", "saved_tokens")


def usage_key(tenant: str, scope: str, day: str) -> str:
    """The day's usage hash nginx's zccp.plugins.limits.admit meters into (scope: "t" or "k:<key id>")."""
    return f"zccp:use:{{{tenant}}}:{scope}:{day}"


async def usage(redis: Any, tenant: str, key_ids: list[str], days: list[str]) -> dict[str, Any]:
    """Summed over `days` (YYYYMMDD, UTC): the tenant's usage and each key's; fields
    USAGE_FIELDS and status_<code> counts."""
    def add(into: dict[str, int], raw: dict[bytes, bytes]) -> None:
        for k, v in raw.items():
            name = k.decode()
            into[name] = into.get(name, 0) + int(v)

    out: dict[str, Any] = {"tenant": {f: 0 for f in USAGE_FIELDS}, "keys": {}}
    for day in days:
        add(out["tenant"], await redis.hgetall(usage_key(tenant, "t", day)))
        for kid in key_ids:
            add(out["keys"].setdefault(kid, {f: 0 for f in USAGE_FIELDS}),
                await redis.hgetall(usage_key(tenant, "k:" + kid, day)))
    return out
