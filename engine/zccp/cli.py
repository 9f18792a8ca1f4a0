"""Command-line entry points: zccp-engine, zccp-nginx, zccp-stack, zccp-cache."""

from __future__ import annotations

import argparse
import signal
import sys
import time
from pathlib import Path

from zccp.config import ConfigError, load_config


def _load(path: str):
    try:
        return load_config(path)
    except ConfigError as exc:
        print(f"zccp: config error: {exc}", file=sys.stderr)
        sys.exit(2)


def engine_main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="zccp-engine", description="Run the ZCCP engine process.")
    p.add_argument("--config", required=True)
    p.add_argument("--check", action="store_true", help="validate the config and exit")
    args = p.parse_args(argv)
    cfg = _load(args.config)
    if args.check:
        print(f"{args.config}: ok")
        return
    from zccp.engine import run_engine
    from zccp.logs import setup_logging

    setup_logging(cfg.logging.level, cfg.logging.file)
    run_engine(cfg)


def nginx_main(argv: list[str] | None = None) -> None:
    args_in = sys.argv[1:] if argv is None else argv
    # `zccp-nginx render ...` is the documented form; the bare `zccp-nginx --config ...`
    # (what older scripts and the container entrypoint call) is its alias.
    if args_in[:1] == ["render"]:
        args_in = args_in[1:]
    p = argparse.ArgumentParser(prog="zccp-nginx render", description="Render ZCCP's nginx includes from config.yaml "
                                "(docs/existing-nginx.md: adding them to an nginx that already runs).")
    p.add_argument("--config", required=True)
    p.add_argument("--out", required=True, help="directory for zccp_http.conf / zccp_server.conf")
    p.add_argument("--standalone", action="store_true", help="also render a complete nginx.conf")
    p.add_argument("--prefix", help="nginx prefix for --standalone (logs, temp files)")
    args = p.parse_args(args_in)
    from zccp.nginx_conf import render

    r = render(_load(args.config), Path(args.out), args.standalone, Path(args.prefix) if args.prefix else None)
    for f in (r.http_conf, r.server_conf, r.nginx_conf):
        if f:
            print(f)


def stack_main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="zccp-stack", description="Run redis + engine + nginx on loopback.")
    p.add_argument("command", choices=["up"])
    p.add_argument("--config", default="config.yaml")
    p.add_argument("--run-dir", default=".run")
    args = p.parse_args(argv)
    cfg = _load(args.config)
    from zccp.cache.redis_target import parse_redis_url
    from zccp.stack import StackError, base_url, engine_service, nginx_service, redis_service

    run_dir = Path(args.run_dir).resolve()
    started = []
    stopping = False

    def stop(*_: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    try:
        if cfg.cache.enabled and parse_redis_url(cfg.cache.redis_url).topology == "single":
            started.append(redis_service(cfg.cache.redis_url, run_dir))   # a Cluster or Sentinels: yours, running
        started.append(engine_service(Path(args.config).resolve(), cfg, run_dir))
        nginx, _ = nginx_service(cfg, run_dir)
        started.append(nginx)
        url = base_url(cfg)
        print(f"ZCCP is up on {url} (logs in {run_dir / 'logs'}). Try:\n")
        print(f"  curl -s {url}/v1/messages -H 'content-type: application/json' \\\n"
              f"    -d '{{\"model\":\"{cfg.model.name}\",\"max_tokens\":32,"
              f"\"messages\":[{{\"role\":\"user\",\"content\":\"Hello\"}}]}}'\n")
        print("Ctrl-C stops nginx, the engine and redis.", flush=True)
        while not stopping and all(s.alive for s in started):
            time.sleep(0.2)
        for s in started:
            if not s.alive:
                print(f"zccp-stack: {s.name} exited; stopping the rest", file=sys.stderr)
    except StackError as exc:
        print(f"zccp-stack: {exc}", file=sys.stderr)
        sys.exit(1)
    finally:
        for s in reversed(started):
            s.stop()


def cache_main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="zccp-cache", description="Operate the response cache in Redis.")
    sub = p.add_subparsers(dest="command", required=True)
    pp = sub.add_parser("purge", help="delete cache entries (straight in Redis, at cache.redis_url)")
    pp.add_argument("--config", required=True)
    what = pp.add_mutually_exclusive_group(required=True)
    what.add_argument("--all", action="store_true", help="every entry")
    what.add_argument("--scope", help="one scope: shared, anonymous, or a tenant digest (64 hex digits)")
    what.add_argument("--tenant", help="one tenant, by its source value (an API key, a user id): hashed here")
    what.add_argument("--key", help="one exact key (64 hex digits, as the engine logs it)")
    args = p.parse_args(argv)
    cfg = _load(args.config)
    import asyncio

    from zccp.cache.purge import parse_purge, purge
    from zccp.cache.redis_target import connect, parse_redis_url

    fields = {"all": True} if args.all else {k: v for k in ("scope", "tenant", "key") if (v := getattr(args, k))}
    try:
        req = parse_purge(fields)
    except ValueError as exc:
        print(f"zccp-cache: --{exc}", file=sys.stderr)
        sys.exit(2)

    target = parse_redis_url(cfg.cache.redis_url)

    async def run() -> int:
        conn = connect(target, timeout_s=5)
        try:
            return await purge(conn.client, req)
        finally:
            await conn.aclose()

    try:
        n = asyncio.run(run())
    except Exception as exc:  # redis unreachable, a refused command: say which
        print(f"zccp-cache: purge failed at {target.describe()}: {exc}", file=sys.stderr)
        sys.exit(1)
    print(f"purged {n} keys")


def main() -> None:
    cmds = {"engine": engine_main, "nginx": nginx_main, "stack": stack_main, "cache": cache_main}
    if len(sys.argv) < 2 or sys.argv[1] not in cmds:
        print(f"usage: python -m zccp.cli {{{','.join(cmds)}}} ...", file=sys.stderr)
        sys.exit(2)
    cmds[sys.argv[1]](sys.argv[2:])


if __name__ == "__main__":
    main()
