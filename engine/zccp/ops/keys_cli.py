"""`zccp-keys`: API keys in Redis (zccp.config.keystore; docs/keys.md).

    zccp-keys create --config C --tenant T [--name N] [--model M ...] [--expires-in 30d]
                     [--rpm N] [--itpm N] [--otpm N] [--concurrency N] [--daily-tokens N] [--monthly-tokens N]
    zccp-keys tenant --config C --tenant T [--rpm N] ... (the tenant's own limits)
    zccp-keys usage  --config C --tenant T [--days N]   (requests, tokens, cache hits, tokens saved)
    zccp-keys list   --config C [--tenant T]
    zccp-keys revoke --config C KEY_ID
    zccp-keys rotate --config C KEY_ID [--grace 300]
    zccp-keys create --keys-file F --tenant T [...]   (one host: the key listed in auth.keys_file)
    zccp-keys hash < key                              (a key's SHA-256, as a keys file lists it)

`--json` prints one JSON object (create, rotate: with the secret, shown only then).
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
import time
from dataclasses import asdict
from collections.abc import Awaitable, Callable
from typing import Any

import orjson

from zccp.config import ConfigError, auth_redis_url, load_config
from zccp.config.keystore import LIMIT_NAMES, IndexEntry, KeyRecord, KeyStore, Limits, add_to_keys_file, key_hash, usage

_DURATION = re.compile(r"(\d+)([smhdw]?)")
_UNIT = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_duration(text: str) -> int:
    m = _DURATION.fullmatch(text.strip())
    if not m or int(m.group(1)) <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a duration such as 3600, 90m, 12h, 30d")
    return int(m.group(1)) * _UNIT[m.group(2)]


def _record_view(rec: KeyRecord) -> dict[str, Any]:
    d: dict[str, Any] = orjson.loads(rec.to_json())
    return d


def _entry_view(e: IndexEntry) -> dict[str, Any]:
    d = _record_view(e.record)
    d["revoked_at"] = e.revoked_at or None
    d["status"] = "revoked" if e.revoked_at else (
        "expired" if e.record.expires_at and e.record.expires_at <= time.time() else "active")
    return d


def _run(cfg_path: str, op: Callable[[KeyStore], Awaitable[Any]]) -> Any:
    from zccp.cache.redis_target import connect, parse_redis_url

    try:
        cfg = load_config(cfg_path)
    except ConfigError as exc:
        print(f"zccp-keys: config error: {exc}", file=sys.stderr)
        sys.exit(2)
    target = parse_redis_url(auth_redis_url(cfg))

    async def go() -> Any:
        conn = connect(target, timeout_s=5)
        try:
            return await op(KeyStore(conn.client))
        finally:
            await conn.aclose()

    try:
        return asyncio.run(go())
    except KeyError as exc:
        print(f"zccp-keys: no such key: {exc.args[0]}", file=sys.stderr)
        sys.exit(1)
    except ValueError as exc:
        print(f"zccp-keys: {exc}", file=sys.stderr)
        sys.exit(2)
    except Exception as exc:  # redis unreachable, a refused command: say where
        print(f"zccp-keys: failed at {target.describe()}: {exc}", file=sys.stderr)
        sys.exit(1)


def _print(obj: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print(orjson.dumps(obj).decode())
        return
    for k, v in obj.items():
        print(f"{k}: {v}")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="zccp-keys", description="Manage ZCCP API keys (stored as hashes in Redis).")
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser("create", help="make a key; its secret is printed once")
    c.add_argument("--tenant", required=True, help="the tenant the key belongs to (its cache and limits)")
    c.add_argument("--name", default="", help="a label for operators")
    c.add_argument("--model", action="append", default=[], help="a model the key may use (repeat; none: any)")
    c.add_argument("--expires-in", type=parse_duration, help="e.g. 90m, 12h, 30d (default: never)")
    for name in LIMIT_NAMES:
        c.add_argument("--" + name.replace("_", "-"), type=int, default=0, help=f"limit {name} (0: none)")
    c.add_argument("--keys-file", help="list the key in this file (auth.keys_file) instead of Redis; "
                   "nginx reads it at start and reload")
    sub.add_parser("hash", help="the SHA-256 of the key on standard input (a keys file lists keys by it)")
    tl = sub.add_parser("tenant", help="set a tenant's own limits (over all its keys; 0: none)")
    tl.add_argument("--tenant", required=True)
    for name in LIMIT_NAMES:
        tl.add_argument("--" + name.replace("_", "-"), type=int, default=0, help=f"limit {name} (0: none)")
    ls = sub.add_parser("list", help="every key (never a secret)")
    ls.add_argument("--tenant")
    rv = sub.add_parser("revoke", help="refuse a key on every host (within auth.cache_ttl_s)")
    rv.add_argument("key_id")
    rt = sub.add_parser("rotate", help="a new secret for a key; the old one works --grace seconds more")
    rt.add_argument("key_id")
    rt.add_argument("--grace", type=int, default=0)
    us = sub.add_parser("usage", help="a tenant's metered usage and its keys' (UTC days)")
    us.add_argument("--tenant", required=True)
    us.add_argument("--days", type=int, default=1, help="today and the days before it (default 1: today)")
    for sp in (c, tl, ls, rv, rt, us):
        sp.add_argument("--config", required=sp is not c)
        sp.add_argument("--json", action="store_true", help="print JSON")
    args = p.parse_args(argv)

    if args.command == "hash":
        print(key_hash(sys.stdin.read().strip()))
    elif args.command == "create" and args.keys_file:
        limits = Limits(**{n: getattr(args, n) for n in LIMIT_NAMES})
        expires = time.time() + args.expires_in if args.expires_in else 0.0
        try:
            secret, rec = add_to_keys_file(args.keys_file, args.tenant, args.name, tuple(args.model), expires, limits)
        except ValueError as exc:
            print(f"zccp-keys: {exc}", file=sys.stderr)
            sys.exit(2)
        _print({"key": secret, **_record_view(rec)}, args.json)
    elif args.command == "create":
        if not args.config:
            p.error("create: --config or --keys-file is required")
        limits = Limits(**{n: getattr(args, n) for n in LIMIT_NAMES})
        expires = time.time() + args.expires_in if args.expires_in else 0.0
        secret, rec = _run(args.config, lambda ks: ks.create(args.tenant, args.name, tuple(args.model), expires,
                                                            limits))
        _print({"key": secret, **_record_view(rec)}, args.json)
    elif args.command == "tenant":
        limits = Limits(**{n: getattr(args, n) for n in LIMIT_NAMES})

        async def set_limits(ks: KeyStore) -> Limits:
            await ks.set_tenant_limits(args.tenant, limits)
            return await ks.tenant_limits(args.tenant)

        got = _run(args.config, set_limits)
        _print({"tenant": args.tenant, "limits": {k: v for k, v in asdict(got).items() if v}}, args.json)
    elif args.command == "usage":
        now = time.time()
        days = [time.strftime("%Y%m%d", time.gmtime(now - 86400 * i)) for i in range(max(1, args.days))]

        async def read_usage(ks: KeyStore) -> dict[str, Any]:
            ids = [e.record.id for e in await ks.list(args.tenant)]
            return await usage(ks.redis, args.tenant, ids, days)

        got = _run(args.config, read_usage)
        if args.json:
            print(orjson.dumps({"days": days, **got}).decode())
        else:
            print(f"tenant {args.tenant} ({days[-1]}..{days[0]}): {got['tenant']}")
            for kid, u in got["keys"].items():
                print(f"  {kid}: {u}")
    elif args.command == "list":
        entries = _run(args.config, lambda ks: ks.list(args.tenant))
        if args.json:
            print(orjson.dumps([_entry_view(e) for e in entries]).decode())
        else:
            for e in entries:
                v = _entry_view(e)
                print(f"{v['id']}  {v['tenant']}  {v['hint']}…  {v['status']}  models={','.join(v['models']) or '*'}"
                      f"  limits={v['limits'] or '-'}  {v['name']}")
    elif args.command == "revoke":
        e = _run(args.config, lambda ks: ks.revoke(args.key_id))
        _print(_entry_view(e), args.json)
    else:
        secret, rec = _run(args.config, lambda ks: ks.rotate(args.key_id, args.grace))
        _print({"key": secret, **_record_view(rec)}, args.json)


if __name__ == "__main__":
    main()
