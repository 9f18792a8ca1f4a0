"""A small nginx with the Lua fingerprint's test-only locations (tests/support/nginx/fp_test.conf),
and the comparison of its answers with the Python fingerprint: the Lua/Python identity checks
(tests/integration/test_fingerprint_identity.py, test_properties.py) and bench/csf_speed.py.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import shutil
import socket
import subprocess
import time
from pathlib import Path

from tests.support.checkout import REPO
from zccp.cache import fingerprint as F
from zccp.cache.fp.tables import EXCLUDED_KEYS
from zccp.cache.mask_apply import MaskSet

VECTORS = REPO / "shm_abi" / "vectors" / "fingerprint_vectors.json"
SNIPPET = Path(__file__).resolve().parent / "nginx" / "fp_test.conf"
MODULES = ("/usr/lib/nginx/modules/ndk_http_module.so", "/usr/lib/nginx/modules/ngx_http_lua_module.so")
NGINX = shutil.which("nginx") or "/usr/sbin/nginx"


def require_nginx_lua() -> None:
    """The identity checks are required, not optional: without nginx and its Lua module they
    fail (scripts/setup.sh installs both), they never skip."""
    missing = [f for f in (NGINX, *MODULES) if not os.path.exists(f)]
    assert not missing, f"needs nginx with libnginx-mod-http-lua (bash scripts/setup.sh); missing: {missing}"


# --------------------------------------------------------------------------- nginx

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def lua_long_string(b: bytes) -> bytes:
    level = 0
    while b"]" + b"=" * level + b"]" in b + b"]" or b"]" + b"=" * level + b"]" in b"]" + b:
        level += 1
    eq = b"=" * level
    # a leading newline would be swallowed by Lua: start with one of our own
    return b"[" + eq + b"[\n" + b + b"]" + eq + b"]"


def write_patterns(path: Path, entries) -> None:
    out = [b"return {\n"]
    for name, pat, repl in entries:
        out.append(b"    { name = " + lua_long_string(name.encode()) + b", pattern = " + lua_long_string(_b(pat))
                   + b", replacement = " + lua_long_string(_b(repl)) + b" },\n")
    out.append(b"}\n")
    path.write_bytes(b"".join(out))


def _b(x) -> bytes:
    return x if isinstance(x, bytes) else x.encode()


class FpNginx:
    def __init__(self, root: Path, patterns: Path, last_good: Path, lua_root: Path = REPO, snippet: Path | None = None):
        self.prefix = root
        self.lua_root = lua_root                 # a checkout (bench/csf_speed.py runs another commit's)
        self.snippet = snippet or SNIPPET
        self.patterns = patterns
        self.last_good = last_good
        self.port = _free_port()
        self.conf = root / "nginx.conf"
        self.proc: subprocess.Popen | None = None
        self._conn: http.client.HTTPConnection | None = None

    def start(self) -> None:
        require_nginx_lua()
        p = self.prefix
        for d in ("logs", "tmp"):
            (p / d).mkdir(parents=True, exist_ok=True)
        user = "user root;\n" if os.geteuid() == 0 else ""
        self.conf.write_text(f"""{user}worker_processes 1;
pid {p}/nginx.pid;
error_log {p}/logs/error.log notice;
load_module {MODULES[0]};
load_module {MODULES[1]};
events {{ worker_connections 256; }}
http {{
    access_log off;
    client_body_temp_path {p}/tmp/body;
    proxy_temp_path {p}/tmp/proxy;
    fastcgi_temp_path {p}/tmp/fastcgi;
    uwsgi_temp_path {p}/tmp/uwsgi;
    scgi_temp_path {p}/tmp/scgi;
    keepalive_requests 100000;
    lua_package_path "{self.lua_root}/lua/?.lua;;";
    init_by_lua_block {{
        require("zccp.fp.mask_store").init({{ path = "{self.patterns}", last_good_path = "{self.last_good}" }})
        require("zccp.fp.fingerprint")
    }}
    server {{
        listen 127.0.0.1:{self.port};
        include {self.snippet};
    }}
}}
""")
        log = open(p / "logs" / "stdout.log", "ab")
        self.proc = subprocess.Popen([NGINX, "-p", str(p), "-c", str(self.conf), "-g", "daemon off;"],
                                     stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     start_new_session=True)
        log.close()
        end = time.monotonic() + 15
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError("nginx exited:\n" + self.log_tail())
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("nginx did not start:\n" + self.log_tail())

    def log_tail(self, n: int = 40) -> str:
        text = ""
        for f in ("logs/error.log", "logs/stdout.log"):
            try:
                text += (self.prefix / f).read_text(errors="replace")
            except OSError:
                pass
        return "\n".join(text.splitlines()[-n:])

    def post(self, path: str, data: bytes) -> bytes:
        for attempt in (1, 2):
            if self._conn is None:
                self._conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
            try:
                self._conn.request("POST", path, body=data, headers={"Content-Type": "application/octet-stream"})
                r = self._conn.getresponse()
                body = r.read()
                if r.status != 200:
                    raise AssertionError(f"{path}: HTTP {r.status}: {body[:500]!r}\n{self.log_tail()}")
                return body
            except (http.client.HTTPException, ConnectionError):
                self._conn.close()
                self._conn = None
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def get_json(self, path: str) -> dict:
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        try:
            c.request("GET", path)
            r = c.getresponse()
            info = json.loads(r.read())
            for k in ("names", "errors"):  # lua-cjson encodes an empty list as {}
                if k in info and not info[k]:
                    info[k] = []
            return info
        finally:
            c.close()

    def _workers(self) -> list[int]:
        text = (self.prefix / "logs" / "error.log").read_text(errors="replace")
        return [int(m) for m in re.findall(r"start worker process (\d+)", text)]

    def reload(self) -> None:
        """nginx -s reload, then wait until the new worker is the one answering."""
        before = self._workers()
        subprocess.run([NGINX, "-p", str(self.prefix), "-c", str(self.conf), "-s", "reload"], check=True,
                       capture_output=True)
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        end = time.monotonic() + 20
        while time.monotonic() < end:  # a new worker started and every old one has exited
            new = self._workers()
            if len(new) > len(before) and not any(os.path.exists(f"/proc/{pid}") for pid in before):
                if self.get_json("/_fp/masks").get("pid") == new[-1]:
                    return
            time.sleep(0.05)
        raise AssertionError("the reload did not take effect:\n" + self.log_tail())

    def stop(self) -> None:
        if self._conn is not None:
            self._conn.close()
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)


def snippet_nginx(root: Path, snippet: Path) -> FpNginx:
    """A started FpNginx serving `snippet`'s test-only locations, with the shipped masks."""
    patterns = root / "mask_patterns.lua"
    shutil.copy(REPO / "lua" / "zccp" / "mask_patterns.lua", patterns)
    srv = FpNginx(root / "ngx", patterns, root / "last_good.lua", snippet=snippet)
    srv.start()
    return srv


def records(items, header) -> bytes:
    out = []
    for it in items:
        h, data = header(it)
        out.append(f"{h} {len(data)}\n".encode() + data)
    return b"".join(out)



def lua_compute(ngx: FpNginx, items: list[tuple[str, bytes]], limit: int | None = None) -> list[str]:
    path = "/_fp/compute" + (f"?limit={limit}" if limit else "")
    out = ngx.post(path, records(items, lambda it: (it[0], it[1]))).decode().split("\n")
    assert out[-1] == ""
    assert len(out) - 1 == len(items)
    return out[:-1]


def py_line(fp: F.Fingerprint | None) -> str | None:
    if fp is None:
        return None
    near = fp.near
    return " ".join([
        "OK", fp.exact_key.hex(), fp.prefix_key.hex(), "1" if fp.masked else "0", "1" if near else "0",
        str(fp.tokens), "%016x" % fp.csf_key if near else "-",
        ",".join("%016x" % b for b in fp.bands) if near else "-",
        ",".join(str(v) for v in fp.signature) if near else "-",
    ])


# nginx's answer for a body holding a number it cannot keep exact (fingerprint.md §6)
BIG_NUMBER_NIL = "a number beyond 2^53: the engine fingerprints this body"


def holds_big_number(api: str, body: bytes) -> bool:
    """The canonical form would hold a number of magnitude >= 2^53 (infinities too)."""
    def big(v) -> bool:
        if isinstance(v, dict):
            return any(big(x) for x in v.values())
        if isinstance(v, list):
            return any(big(x) for x in v)
        return isinstance(v, (int, float)) and not isinstance(v, bool) and abs(v) >= 2**53
    doc = F.decode_request(api, body) or {}
    return big({k: v for k, v in doc.items() if k not in EXCLUDED_KEYS})


# fields of an "OK ..." line
EXACT, PREFIX, MASKED, NEAR, TOKENS = 1, 2, 3, 4, 5


def explain(ngx: FpNginx, masks: MaskSet, api: str, body: bytes) -> str:
    dbg: dict = {}
    F.compute(api, body, masks, debug=dbg)
    lua = json.loads(ngx.post("/_fp/debug", f"{api} {len(body)}\n".encode() + body))
    lines = [f"body: {body[:300]!r}"]
    for k in ("canonical", "prompt"):
        lv = bytes.fromhex(lua[k]) if lua.get(k) is not None else None
        pv = dbg.get(k)
        if lv != pv:
            lines.append(f"{k} differs:\n  lua: {lv!r:.600}\n  py:  {pv!r:.600}")
    if "error" in lua:
        lines.append(f"lua error: {lua['error']}")
    return "\n".join(lines)


def compare(ngx, masks, items, limit=None):
    lua = lua_compute(ngx, items, limit)
    bad = []
    for (api, body), lline in zip(items, lua, strict=True):
        fp = F.compute(api, body, masks)
        if limit is None and len(body) > F.DECODE_LIMIT:
            assert lline == "NIL body too large to fingerprint"
            assert fp is not None or F.compute(api, body, masks) is None
            continue
        if lline == "NIL " + BIG_NUMBER_NIL:
            # nginx cannot keep such a number exact: the engine computes the keys (§6)
            if fp is None or not holds_big_number(api, body):
                bad.append(f"lua refused a body without a big number\n{explain(ngx, masks, api, body)}")
            continue
        pl = py_line(fp)
        if pl is None:
            if not lline.startswith("NIL "):
                bad.append(f"python None, lua {lline[:120]}\n{explain(ngx, masks, api, body)}")
        elif pl != lline:
            bad.append(f"mismatch\n lua {lline[:200]}\n py  {pl[:200]}\n{explain(ngx, masks, api, body)}")
        if len(bad) >= 5:
            break
    assert not bad, "\n\n".join(bad)
    return lua


# words for generated texts
WORDS = ("the of and to in is you that it he was for on are as with his they at be this have from or one "
         "had by word but not what all were we when your can said there use an each which she do how their "
         "if will up other about out many then them these so some her would make like him into time has "
         "look two more write go see number no way could people my than first water been call who oil its "
         "now find long down day did get come made may part patient report summary translate explain code "
         "function return error because schema invoice customer order").split()
