"""Who may be served whose answers: tenants, where an entry lives in Redis, and its keys.

Every key of one request lives under one Redis Cluster hash tag, `{<tag>}`, made from the
fingerprint's prefix key (the request without its final message: system, tools, every
parameter, every earlier turn). A lookup script therefore touches one hash slot, and a
near-duplicate is only ever looked for among requests with the very same prefix.

Inside a tag, entries belong to an *owner*: `shared` (anyone may be served it), a
tenant (`t<32 hex>`, the first 16 bytes of the tenant digest), or `anon` (requests whose
tenant source is absent: they are one tenant). `cache.scope` decides (docs/cache.md):

    tenant        (default) everything belongs to the tenant: no answer, and no sign that
                  a prompt was sent (HIT, Age), crosses tenants
    isolated      the same (the name older configs use)
    shared_exact  opt-in: an unmasked request's answer is `shared` (an exact hit needs the
                  same text; the answer may still be another tenant's sampled one, and a
                  HIT tells that someone sent the prompt); masked answers and every near
                  index belong to the tenant
    global        opt-in: every entry, and the near index, is `shared`

A `Cache-Control: no-store` request reads its own owner's entries only, never `shared`
ones: a request that leaves no trace must not be a free probe of what others sent.

Keys (all with the configured TTL):
    zccp:v2:{<tag>}:<owner>:e:<exact hex>             the entry (zccp.cache.answer)
    zccp:v2:{<tag>}:<owner>:s:<exact hex>             near record (zccp.cache.near): prefix key, where the
                                                      entry is, the final turn's units
    zccp:v2:{<tag>}:<owner>:n:<index hex>             near index: set of exact keys (hex) whose final turn
                                                      reads the same (zccp.cache.near.index_name)
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Literal

from zccp.transport.abi import Flag, ffi
from zccp.transport.arena import SlotView
from zccp.config import CacheConfig
from zccp.shared_types import GenerationRequest

PREFIX = "zccp:v2:"          # since fingerprint version 2 (version 3 changed the hashes only): v1 is never read
SHARED = "shared"
ANON = "anon"
ScopeMode = Literal["tenant", "isolated", "shared_exact", "global"]


def tenant_digest(value: str | bytes) -> bytes:
    """SHA-256 of a tenant source's value (what nginx writes into request.tenant)."""
    return hashlib.sha256(value.encode("utf-8", "surrogateescape") if isinstance(value, str) else value).digest()


def tenant_of(view: SlotView, req: GenerationRequest, cfg: CacheConfig) -> bytes | None:
    """The request's tenant digest, or None (anonymous). nginx writes it for header sources
    (the engine never sees headers) and for the body's user when it decoded the body; the
    engine reads the body's user itself otherwise."""
    if view.header.flags & Flag.TENANT:
        return bytes(ffi.buffer(view.request.tenant, 32))
    if cfg.tenant_source == "user" and req.user:
        return tenant_digest(req.user)
    return None


def owner_of(tenant: bytes | None) -> str:
    return ANON if tenant is None else "t" + tenant[:16].hex()


def hash_tag(prefix_key: bytes) -> str:
    return hashlib.sha256(b"zccp-tag/2\n" + prefix_key).hexdigest()[:32]


@dataclass(frozen=True)
class Placement:
    """Where one request's entries are read and written, and what nginx may do with its answer."""

    tag: str                     # the hash tag: every key below shares it
    lookup_owners: tuple[str, ...]   # exact lookups, in this order (may be empty: no-store)
    near_owner: str              # the near index read and written
    store_owner: str             # where this request's answer is stored
    read_shared: bool = True     # `shared` entries may be served (not to a no-store request)

    @property
    def near_read(self) -> bool:
        """The near index may be read: a shared one only when shared entries may be served."""
        return self.read_shared or self.near_owner != SHARED

    @property
    def shared(self) -> bool:
        """The stored answer may be served to any tenant (meta.cache_scope 0)."""
        return self.store_owner == SHARED

    def key(self, owner: str, kind: str, name: str) -> str:
        return f"{PREFIX}{{{self.tag}}}:{owner}:{kind}:{name}"


def place(prefix_key: bytes, tenant: bytes | None, masked: bool, mode: ScopeMode,
          no_store: bool = False) -> Placement:
    tag = hash_tag(prefix_key)
    if mode == "global":
        p = Placement(tag, (SHARED,), SHARED, SHARED)
    else:
        own = owner_of(tenant)
        if mode in ("tenant", "isolated") or masked:
            return Placement(tag, (own,), own, own)
        p = Placement(tag, (SHARED,), own, SHARED)
    if no_store:   # never a probe of the shared entries
        return Placement(tag, tuple(o for o in p.lookup_owners if o != SHARED), p.near_owner, p.store_owner, False)
    return p


# --------------------------------------------------------------------------- purge patterns

def owner_for_scope(scope: str) -> str:
    """`shared`, `anonymous`, or a tenant digest (64 hex digits) -> the owner in key names.
    ValueError names what is wrong."""
    if scope == SHARED:
        return SHARED
    if scope in ("anonymous", ANON):
        return ANON
    s = scope.lower()
    if len(s) == 64 and all(c in "0123456789abcdef" for c in s):
        return "t" + s[:32]
    raise ValueError("expected 'shared', 'anonymous' or a tenant digest (64 hex digits)")


def purge_patterns(what: Literal["all", "scope", "key"], value: str = "") -> list[str]:
    """SCAN MATCH patterns of the keys a purge deletes. `all` takes every ZCCP key, of
    every fingerprint version; a scope takes its owner's keys under every tag; a key,
    that exact key's entries and near records (their near index members then point at
    nothing and are skipped)."""
    if what == "all":
        return ["zccp:*"]
    if what == "scope":
        return [f"{PREFIX}{{*}}:{owner_for_scope(value)}:*"]
    k = value.lower()
    if len(k) != 64 or any(c not in "0123456789abcdef" for c in k):
        raise ValueError("expected an exact key: 64 hex digits")
    return [f"{PREFIX}{{*}}:*:e:{k}", f"{PREFIX}{{*}}:*:s:{k}"]
