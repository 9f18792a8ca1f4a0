"""docs/existing-nginx.md and scripts/existing-nginx-walkthrough.sh cannot drift apart: the
script runs the page's own fenced blocks, and its plan names each one by language and first
command. `--list` checks the page against the plan (no Docker): it passes on the page as it
is, and fails on a page with a block the plan does not know, or with one changed."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "existing-nginx-walkthrough.sh"
DOC = ROOT / "docs" / "existing-nginx.md"


def _list(doc: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(SCRIPT), "--list"], capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin", "WALK_DOC": str(doc)})


def test_every_block_of_the_page_is_in_the_walkthroughs_plan() -> None:
    r = _list(DOC)
    assert r.returncode == 0, r.stderr
    rows = r.stdout.splitlines()
    assert len(rows) == DOC.read_text().count("```") // 2, r.stdout
    actions = [row.split()[2] for row in rows]
    # what is not run says why; Removal and Verify over HTTPS are run
    assert all(a in ("run", "site", "skip", "alt") for a in actions), rows
    assert any("Removal" in row and row.split()[2] == "run" for row in rows), rows
    assert any("HTTPS" in row and row.split()[2] == "run" for row in rows), rows


def test_a_block_the_plan_does_not_know_fails_the_check(tmp_path: Path) -> None:
    text = DOC.read_text()
    added = tmp_path / "added.md"
    added.write_text(text.replace("## Removal\n", "## Removal\n\n```sh\nrm -rf /etc/nginx/something\n```\n", 1))
    r = _list(added)
    assert r.returncode != 0 and "fenced blocks, the plan" in r.stderr, (r.stdout, r.stderr)
    changed = tmp_path / "changed.md"
    changed.write_text(text.replace("rm /etc/nginx/conf.d/zccp.conf", "rm -f /etc/nginx/conf.d/zccp.conf", 1))
    r = _list(changed)
    assert r.returncode != 0 and "the plan expects" in r.stderr, (r.stdout, r.stderr)
