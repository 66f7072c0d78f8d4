"""The manual builds without warnings, and the README stays short with links that resolve."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README_MAX_LINES = 200
RELATIVE_LINK = re.compile(r"\]\((?!https?://|mailto:|#)([^)\s]+)\)")


def test_the_manual_builds_strictly(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr


def test_the_readme_is_short_and_its_relative_links_resolve() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= README_MAX_LINES
    targets = RELATIVE_LINK.findall(text)
    assert any(target.startswith("docs/") for target in targets)
    missing = [t for t in targets if not (ROOT / t.split("#", 1)[0]).is_file()]
    assert missing == [], f"README links to files that do not exist: {missing}"
