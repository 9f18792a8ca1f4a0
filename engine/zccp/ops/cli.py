"""Command-line entry points: zccp-engine, zccp-nginx, zccp-stack, zccp-cache."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path

from zccp.config import Config, ConfigError, load_config, model_names
from zccp.model.checkpoint import check_model_files

RUN_DIR_HELP = ("the stack's run directory (default .run): logs, nginx's files, and unless "
                "config.yaml says otherwise the doorbell socket and the masks' last-good file")


def _load(path: str, run_dir: str = ".run", check_host: bool = True, engine_only: bool = False) -> Config:
    """config.yaml resolved for the run directory; a config error exits with status 2."""
    from zccp.config import runtime

    try:
        cfg = runtime.resolve(load_config(path), Path(run_dir))
        if check_host:
            runtime.check_host(cfg, engine_only)
        return cfg
    except ConfigError as exc:
        print(f"zccp: config error: {exc}", file=sys.stderr)
        sys.exit(2)


def _one_engine(cfg: Config, name: str | None) -> Config:
    """The config this engine process runs with: the entry `name` of engines:, or the
    top-level model and arena when there is no such list."""
    from zccp.config import for_engine

    if name is None:
        if cfg.engines:
            raise ConfigError(f"{cfg.path}: engines: lists {', '.join(e.name for e in cfg.engines)}; "
                              "name the one this process serves with --engine")
        return cfg
    return for_engine(cfg, name)


def engine_main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="zccp-engine", description="Run the ZCCP engine process.")
    p.add_argument("--config", required=True)
    p.add_argument("--run-dir", default=".run", help=RUN_DIR_HELP)
    p.add_argument("--check", action="store_true", help="validate the config against this host and exit")
    p.add_argument("--engine", help="the engine of config.yaml's engines: list this process serves "
                   "(required when the list is there)")
    p.add_argument("--systemd-placement", action="store_true", help="print the systemd drop-in of this engine's "
                   "placement (CPUAffinity=, NUMAPolicy=, NUMAMask=) and exit")
    p.add_argument("--standby", action="store_true", help="import everything, then wait for a line 'go' on "
                   "stdin before starting (zccp-stack's warm standby; EOF: exit)")
    p.add_argument("--warm-standby", action="store_true", help="run the engine as a child with a warm standby "
                   "beside it that takes over when it dies (as zccp-stack does), restarting it at once if it had "
                   "served: for systemd and compose, which would otherwise pay a whole start")
    args = p.parse_args(argv)
    cfg = _load(args.config, args.run_dir, engine_only=True)   # nginx's directories are nginx's to check
    try:
        cfg = _one_engine(cfg, args.engine)
        check_model_files(cfg)
    except ConfigError as exc:
        print(f"zccp: config error: {exc}", file=sys.stderr)
        sys.exit(2)
    if args.check:
        print(f"{args.config}: ok")
        return
    if args.systemd_placement:
        from zccp.process.placement import placement_for, systemd_dropin

        try:
            print(systemd_dropin(placement_for(cfg)), end="")
        except ConfigError as exc:
            print(f"zccp: config error: {exc}", file=sys.stderr)
            sys.exit(2)
        return
    if args.warm_standby:
        sys.exit(_with_standby(cfg, [a for a in (sys.argv[1:] if argv is None else argv) if a != "--warm-standby"]))
    if args.standby:
        _stand_by(cfg.model.backend)
        return engine_main([a for a in (sys.argv[1:] if argv is None else argv) if a != "--standby"])
    import logging

    from zccp.transport.arena import ArenaError
    from zccp.process.engine_main import run_engine
    from zccp.observe.logs import setup_logging

    setup_logging(cfg.logging.level, cfg.logging.file)
    try:
        run_engine(cfg)
    except ArenaError as exc:
        logging.getLogger("zccp.engine").error("cannot start: %s", exc)
        if cfg.logging.file:
            print(f"zccp-engine: {exc}", file=sys.stderr)
        sys.exit(1)


def _with_standby(cfg: Config, engine_args: list[str]) -> int:
    """zccp-engine --warm-standby: the engine (these arguments) as a child, kept running by
    zccp-stack's supervisor with a warm standby; its output is this process's (the journal,
    `docker logs`). SIGTERM or SIGINT stops both; an engine that never serves exits 1."""
    from zccp.ops.stack import Service, StackError, wait_for_engine
    from zccp.ops.supervisor import Supervisor

    stopping = False

    def stop(*_: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    assert cfg.server.socket_path is not None   # resolved by _load
    engine = Service("engine", [sys.executable, "-m", "zccp.ops.cli", "engine", *engine_args], None)
    sup = Supervisor(cfg, [(engine, cfg.server.socket_path)], [], standby=True)
    try:
        engine.start()
        wait_for_engine(engine, cfg)
        return sup.run(lambda: stopping)
    except StackError as exc:
        print(f"zccp-engine: {exc}", file=sys.stderr)
        return 1
    finally:
        sup.stop_engines()
        engine.stop()


def _stand_by(backend: str) -> None:
    """The standby's wait: the request path and the backend's module imported (torch: the
    seconds of a start), then a line on stdin. Taking over, the engine reads config.yaml
    again, as a fresh start would."""
    import zccp.process.engine  # noqa: F401
    from zccp.model.registry import preload_backend

    preload_backend(backend)
    print(f"zccp-engine: standby ready (pid {os.getpid()})", file=sys.stderr, flush=True)
    if sys.stdin.readline().strip() != "go":
        sys.exit(0)


def nginx_main(argv: list[str] | None = None) -> None:
    args_in = sys.argv[1:] if argv is None else argv
    # `zccp-nginx render ...` is the documented form; the bare `zccp-nginx --config ...`
    # (what older scripts and the container entrypoint call) is its alias.
    if args_in[:1] in (["check"], ["check-site"]):
        from zccp.ops.nginx_cli import check_main, check_site_main

        main = check_main if args_in[0] == "check" else check_site_main
        sys.exit(main(args_in[1:], lambda path, run_dir: _load(path, run_dir, check_host=False)))
    if args_in[:1] == ["vendor-lua"]:
        from zccp.ops.lua_vendor_cli import vendor_main

        sys.exit(vendor_main(args_in[1:]))
    if args_in[:1] == ["render"]:
        args_in = args_in[1:]
    p = argparse.ArgumentParser(prog="zccp-nginx render", description="Render ZCCP's nginx includes from config.yaml "
                                "(docs/existing-nginx.md: adding them to an nginx that already runs).")
    p.add_argument("--config", help="config.yaml (required unless --front)")
    p.add_argument("--front", metavar="FRONT_YAML", help="render the front tier's nginx.conf from this file's "
                   "`front:` section instead (docs/scale-out.md); --out is then also its prefix")
    p.add_argument("--out", required=True, help="directory for zccp_http.conf / zccp_server.conf / zccp_admin.conf")
    p.add_argument("--run-dir", default=".run", help=RUN_DIR_HELP)
    p.add_argument("--standalone", action="store_true", help="also render a complete nginx.conf")
    p.add_argument("--prefix", help="nginx prefix for --standalone (temp files; logs go to <prefix>/logs)")
    p.add_argument("--log", metavar="FILE", help="also create the zccp_json access log FILE (if absent) as "
                   "Debian's nginx logs are: --log-owner, mode 0640 (docs/existing-nginx.md, step 6)")
    p.add_argument("--log-owner", metavar="USER:GROUP", default="www-data:adm",
                   help="owner of the --log file (default www-data:adm, as Debian's logrotate makes them)")
    args = p.parse_args(args_in)
    if args.front:
        print(_render_front(args.front, Path(args.out)))
        return
    if not args.config:
        p.error("--config is required")
    from zccp.ops.nginx_conf import render

    r = render(_load(args.config, args.run_dir), Path(args.out), args.standalone,
               Path(args.prefix) if args.prefix else None)
    for f in (r.http_conf, r.server_conf, r.admin_conf, r.nginx_conf):
        if f:
            print(f)
    from zccp.ops.lua_vendor_cli import warn_if_not_vendored

    warn_if_not_vendored()
    if args.log:
        from zccp.ops.log_file import make_log_file

        try:
            print(make_log_file(Path(args.log), args.log_owner).path)
        except (OSError, ValueError) as exc:
            print(f"zccp-nginx: {exc}", file=sys.stderr)
            sys.exit(2)


def _render_front(path: str, out: Path) -> Path:
    from zccp.ops.front_conf import load_front, render_front

    try:
        return render_front(load_front(path), out)
    except ConfigError as exc:
        print(f"zccp: config error: {exc}", file=sys.stderr)
        sys.exit(2)


def _stack_up(cfg: Config, config_path: Path, run_dir: Path, standby: bool = True) -> int:
    from urllib.parse import urlparse

    from zccp.cache.redis_target import parse_redis_url
    from zccp.config.runtime import log_dir
    from zccp.ops.stack import (
        Service,
        StackError,
        base_url,
        engine_services,
        ensure_free,
        nginx_service,
        redis_service,
    )
    from zccp.ops.supervisor import Supervisor

    stopping = False

    def stop(*_: object) -> None:
        nonlocal stopping
        stopping = True

    def interrupt(*_: object) -> None:
        raise KeyboardInterrupt

    # While starting, a signal interrupts the start (what was started is stopped below);
    # once up, it asks the supervisor to stop.
    signal.signal(signal.SIGINT, interrupt)
    signal.signal(signal.SIGTERM, interrupt)
    started: list[Service] = []
    try:
        ensure_free(cfg.server.listen, "server.listen")
        if cfg.cache.enabled and parse_redis_url(cfg.cache.redis_url).topology == "single":
            # a local redis for one server; a Cluster or Sentinels are the user's, already running
            u = urlparse(cfg.cache.redis_url)
            ensure_free(f"{u.hostname or '127.0.0.1'}:{u.port or 6379}", "cache.redis_url")
            started.append(redis_service(cfg.cache.redis_url, run_dir, cfg.cache.redis_maxmemory_mb,
                                         cfg.cache.redis_maxmemory_policy))
        engines = engine_services(config_path, cfg, run_dir)
        started += [svc for svc, _ in engines]
        nginx, _ = nginx_service(cfg, run_dir)
        started.append(nginx)
        url = base_url(cfg)
        print(f"ZCCP is up on {url} (logs in {log_dir(run_dir)}). Try:\n")
        print(f"  curl -s {url}/v1/messages -H 'content-type: application/json' \\\n"
              f"    -d '{{\"model\":\"{model_names(cfg)[0]}\",\"max_tokens\":32,"
              f"\"messages\":[{{\"role\":\"user\",\"content\":\"Hello\"}}]}}'\n")
        print("Ctrl-C stops nginx, the engine and redis. The engine is restarted if it dies.", flush=True)
        signal.signal(signal.SIGINT, stop)
        signal.signal(signal.SIGTERM, stop)
        others = [s for s in started if all(s is not e for e, _ in engines)]
        sup = Supervisor(cfg, engines, others, standby=standby)
        try:
            return sup.run(lambda: stopping)
        finally:
            sup.stop_engines()
    except StackError as exc:
        from zccp.config.plugins import in_config

        print(f"zccp-stack: {in_config(str(exc), str(config_path))}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("zccp-stack: interrupted while starting", file=sys.stderr)
        return 130
    finally:
        for s in reversed(started):
            s.stop()


def _stack_status(cfg: Config, run_dir: Path) -> int:
    import posix_ipc

    from zccp.transport.arena_reader import ArenaReader
    from zccp.config import for_engine
    from zccp.ops.placement_status import describe
    from zccp.ops.stack import StackError, _nginx_master, _workers_of

    try:
        master = _nginx_master(run_dir)
    except StackError as exc:
        print(f"zccp-stack: {exc}", file=sys.stderr)
        return 1
    engines = []
    for name, c in [(e.name, for_engine(cfg, e.name)) for e in cfg.engines] or [("default", cfg)]:
        try:
            reader = ArenaReader(c.shared_memory.name)     # held while its control page is read
            engines.append((name, int(reader.control.engine_pid), c.shared_memory.name))
        except (OSError, ValueError, posix_ipc.Error) as exc:
            print(f"engine {name}: no arena {c.shared_memory.name} ({exc})")
    for line in describe(engines, sorted(_workers_of(master))):
        print(line)
    return 0


def _stack_reload(cfg: Config, run_dir: Path) -> int:
    from zccp.config import mask_state_path
    from zccp.ops.stack import StackError, reload_masks
    from zccp.ops.stack_reload import RenderError, plugins_refused, rerender_nginx

    try:   # config.yaml again: the plugin chain, its settings, the rest of nginx's config
        check = rerender_nginx(cfg, run_dir)
    except (StackError, RenderError) as exc:
        print(f"zccp-stack: {exc}", file=sys.stderr)
        return 1
    if not check.ok:   # what nginx would refuse, by file and line (zccp-nginx check's): no reload
        for e in check.errors:
            print(e, file=sys.stderr)
        print("zccp-stack: not reloaded: nginx would refuse the above (fix them, then reload)", file=sys.stderr)
        return 1
    try:
        m = reload_masks(cfg, run_dir)
    except StackError as exc:
        print(f"zccp-stack: {exc}", file=sys.stderr)
        return 1
    refused = plugins_refused(cfg)
    for e in refused:
        print(f"  plugin refused: {e} (its last good copy stays in force)", file=sys.stderr)
    print(f"nginx reloaded: {m.patterns} mask pattern(s) in force, digest {m.digest[:16]}; the engine "
          f"follows with the next request (it loads {mask_state_path(cfg)})")
    for e in m.errors:
        print(f"  refused: {e} (its previous version, if any, stays in force)", file=sys.stderr)
    return 1 if m.errors or refused else 0


def stack_main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="zccp-stack", description="Run redis + engine + nginx on loopback.")
    p.add_argument("command", choices=["up", "reload", "status"],
                   help="up: start the stack and keep it running; reload: check, render nginx's configuration "
                        "again (the plugin chain and settings), test it and reload nginx: plugins and mask patterns; "
                        "status: the placement in force (each engine's CPUs and arena node, nginx workers' CPUs)")
    p.add_argument("--config", default="config.yaml")
    p.add_argument("--run-dir", default=".run", help=RUN_DIR_HELP)
    p.add_argument("--no-standby", action="store_true", help="no warm standby engine per engine (saves its "
                   "memory; a restart then imports torch again: seconds instead of a tenth)")
    args = p.parse_args(argv)
    run_dir = Path(args.run_dir).resolve()
    cfg = _load(args.config, str(run_dir))
    if args.command == "up":
        sys.exit(_stack_up(cfg, Path(args.config).resolve(), run_dir, standby=not args.no_standby))
    if args.command == "status":
        sys.exit(_stack_status(cfg, run_dir))
    sys.exit(_stack_reload(cfg, run_dir))


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
    cfg = _load(args.config, check_host=False)
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
    _purge_l1(cfg)


def _purge_l1(cfg: Config) -> None:
    """After Redis: this host's nginx L1 (POST /v1/zccp/l1/purge on the admin listener).
    nginx not running is no error (nothing to empty); another answer is said, as is the L1
    of other hosts, which keeps its entries up to cache.l1.ttl_s (docs/cache.md)."""
    if not (cfg.cache.enabled and cfg.cache.l1.enabled):
        return
    from zccp.ops.admin_client import admin_request

    where = f"{cfg.server.admin_listen} /v1/zccp/l1/purge"
    try:
        status, _ = admin_request(cfg, "POST", "/v1/zccp/l1/purge", b"")
    except OSError as exc:   # no nginx there: say so (its L1, if any, empties itself within cache.l1.ttl_s)
        print(f"zccp-cache: nginx's L1 at {where} not emptied: {exc}", file=sys.stderr)
        return
    if status != 200:
        print(f"zccp-cache: nginx's L1 at {where} not emptied: HTTP {status}", file=sys.stderr)
        return
    print("emptied nginx's L1")


def main() -> None:
    cmds = {"engine": engine_main, "nginx": nginx_main, "stack": stack_main, "cache": cache_main}
    if len(sys.argv) < 2 or sys.argv[1] not in cmds:
        print(f"usage: python -m zccp.ops.cli {{{','.join(cmds)}}} ...", file=sys.stderr)
        sys.exit(2)
    cmds[sys.argv[1]](sys.argv[2:])


if __name__ == "__main__":
    main()
