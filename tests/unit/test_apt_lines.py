"""No script, image or page apt-installs Debian's lua-nginx-redis (Depends: nginx-extras, and
with it nineteen more nginx module packages and a reload of the running nginx), its
connector or lua-nginx-dns: their Lua files are unpacked by `zccp-nginx vendor-lua` instead
(docs/libraries.md). Every `apt-get install` / `apt install` command of the checkout's shell
scripts, Dockerfiles and docs is read (continued lines joined), and scripts/setup.sh's
package list is read by bash itself."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NOT_INSTALLED = {"lua-nginx-redis", "lua-nginx-redis-connector", "lua-nginx-dns", "nginx-extras"}
INSTALL = re.compile(r"\bapt(?:-get)?\s+(?:-\S+\s+)*install\b")


def _files() -> list[Path]:
    files = subprocess.run(["git", "ls-files", "*.sh", "*Dockerfile*", "*.md", "*.yaml", "*.yml"], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.split()
    return [ROOT / f for f in files if (ROOT / f).is_file()]


def install_commands(text: str) -> list[str]:
    """Each apt install command of text, its backslash-continued lines joined."""
    joined = re.sub(r"\\\n", " ", text)
    return [line[m.start():] for line in joined.splitlines() if (m := INSTALL.search(line))]


def test_the_reader_sees_a_continued_install_line() -> None:
    text = "RUN apt-get update \\\n && apt-get install -y --no-install-recommends \\\n    nginx lua-nginx-dns\n"
    assert [set(c.split()) & NOT_INSTALLED for c in install_commands(text)] == [{"lua-nginx-dns"}]


def test_no_apt_install_names_the_packages_that_bring_nginx_extras() -> None:
    seen = 0
    for f in _files():
        for cmd in install_commands(f.read_text(errors="replace")):
            seen += 1
            named = set(re.split(r"[\s\"'`()]+", cmd)) & NOT_INSTALLED
            assert not named, f"{f.relative_to(ROOT)}: {cmd.strip()[:200]}"
    assert seen >= 5, seen        # the setup script, the image, the pages: the reader found them


def test_setup_sh_package_list() -> None:
    out = subprocess.run(["bash", "-c", 'eval "$(sed -n "/^APT_PACKAGES=(/,/)/p" scripts/setup.sh)"; '
                          'printf "%s\\n" "${APT_PACKAGES[@]}"'], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout.split()
    assert "libnginx-mod-http-lua" in out and not set(out) & NOT_INSTALLED, out
