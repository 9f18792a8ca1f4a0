"""`zccp-nginx check-site`: which of an operator's locations ZCCP's includes would shadow.

zccp_server.conf adds exact locations (`location = /v1/messages`, ...). In the server that
includes it, nginx answers those paths from them whatever else the server says: a prefix
(`location /`, `location /v1/`) or regex location of the operator's that matches one of
the paths loses it, silently (a backend's own /health behind `location /`); an exact one
of the same path makes `nginx -t` fail (duplicate location). Read from `nginx -T` of the
running nginx, before anything is included (docs/existing-nginx.md).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from zccp.ops.nginx_dump import Directive, parse_dump

# Server-level directives ZCCP's locations inherit or override: said, not refused.
_INHERITED = {
    "limit_req": "inherited: its refusals on ZCCP's paths are answered API-shaped (429/503 with retry-after)",
    "limit_conn": "inherited: its refusals on ZCCP's paths are answered API-shaped (429/503 with retry-after)",
    "add_header": "inherited by ZCCP's locations (they set none)",
    "error_page": "not inherited: ZCCP's locations answer their errors API-shaped",
    "client_max_body_size": "not inherited: ZCCP's locations use limits.max_body_kb",
}


@dataclass(frozen=True)
class Shadowed:
    location: Directive
    server: Directive
    paths: tuple[str, ...]
    duplicate: bool            # an exact location of the same path: nginx -t would fail

    def line(self) -> str:
        loc = " ".join(self.location.args)
        what = ("duplicate: nginx -t fails with duplicate location" if self.duplicate
                else "ZCCP's exact location would answer instead")
        return (f"{self.location.where()}: location {loc} (in {server_label(self.server)}) "
                f"answers {', '.join(self.paths)}: {what}")


def server_label(server: Directive) -> str:
    names = [" ".join(d.args) for d in server.values("server_name")]
    listens = [" ".join(d.args) for d in server.values("listen")]
    return (f"server at {server.where()}"
            + (f" server_name {'; '.join(names)}" if names else "")
            + (f" listen {'; '.join(listens)}" if listens else ""))


def _regex(arg: str, caseless: bool) -> re.Pattern[str] | None:
    try:   # PCRE's named groups in Python's spelling; a pattern Python cannot read is skipped
        return re.compile(re.sub(r"\(\?<(?=[A-Za-z_])", "(?P<", arg), re.I if caseless else 0)
    except re.error:
        return None


def _matches(loc: Directive, path: str) -> tuple[bool, bool]:
    """(whether the location matches path, whether it is an exact location of it)."""
    args = loc.args
    if not args or args[0].startswith("@"):
        return False, False
    if len(args) == 2:
        mod, arg = args
        if mod == "=":
            return arg == path, arg == path
        if mod == "^~":
            return path.startswith(arg), False
        if mod in ("~", "~*"):
            rx = _regex(arg, mod == "~*")
            return bool(rx and rx.search(path)), False
        return False, False
    if args[0].startswith("="):        # `location =/x`
        return args[0][1:] == path, args[0][1:] == path
    return path.startswith(args[0]), False


def _locations(block: Directive) -> list[Directive]:
    out = []
    for loc in block.blocks("location"):
        if not loc.file.endswith("zccp_server.conf"):   # ZCCP's own, already included
            out.append(loc)
        out.extend(_locations(loc))
    return out


def servers(tree: list[Directive]) -> list[Directive]:
    return [s for http in tree if http.name == "http" and http.children is not None for s in http.blocks("server")]


def _selected(server: Directive, want: str | None) -> bool:
    if want is None:
        return True
    names = {a for d in server.values("server_name") for a in d.args}
    listens = {d.args[0] for d in server.values("listen") if d.args}
    return want in names or want in listens


def shadowed(tree: list[Directive], paths: list[str], server: str | None = None) -> list[Shadowed]:
    out = []
    for srv in servers(tree):
        if not _selected(srv, server):
            continue
        for loc in _locations(srv):
            hits = [(p, exact) for p in paths for m, exact in [_matches(loc, p)] if m]
            if hits:
                out.append(Shadowed(loc, srv, tuple(p for p, _ in hits), any(e for _, e in hits)))
    return out


def inherited(tree: list[Directive], server: str | None = None) -> list[str]:
    """What ZCCP's locations take from (or override in) each selected server and its http {}."""
    out = []
    for http in (d for d in tree if d.name == "http" and d.children is not None):
        for d in http.children or []:
            if d.name in _INHERITED:
                out.append(f"{d.where()}: http-level {d.name} {' '.join(d.args)}: {_INHERITED[d.name]}")
        for srv in http.blocks("server"):
            if not _selected(srv, server):
                continue
            for d in srv.children or []:
                if d.name in _INHERITED:
                    out.append(f"{d.where()}: {d.name} {' '.join(d.args)} ({server_label(srv)}): "
                               f"{_INHERITED[d.name]}")
    return out


def check_site(dump_text: str, paths: list[str], server: str | None = None) -> tuple[list[Shadowed], list[str]]:
    tree = parse_dump(dump_text)
    if server is not None and not any(_selected(s, server) for s in servers(tree)):
        from zccp.ops.nginx_dump import DumpError

        raise DumpError(f"no server {{}} with server_name or listen {server!r}")
    return shadowed(tree, paths, server), inherited(tree, server)
