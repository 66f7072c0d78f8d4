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


# Measured in the page by Chromium, after layout: the page's own width, and every table against its box.
_MEASURE = """<script>
addEventListener('load', () => {
  const wide = [...document.querySelectorAll('table')].filter(t => t.scrollWidth > t.parentElement.clientWidth + 1);
  document.body.setAttribute('data-page-overflow', String(document.documentElement.scrollWidth > innerWidth + 1));
  document.body.setAttribute('data-wide-tables', String(wide.length));
});
</script>"""
_VERDICT = re.compile(
    r'data-page-overflow="(\w+)"[^>]*data-wide-tables="(\d+)"|data-wide-tables="(\d+)"[^>]*data-page-overflow="(\w+)"'
)


def test_no_page_of_the_manual_scrolls_sideways_at_1280_pixels(tmp_path: Path) -> None:
    """The readthedocs theme keeps table cells on one line: at 1280 px the writers' promise table, the exit
    codes and the manual's own table ran past the right edge. Every page, opened in headless Chromium."""
    import shutil

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    assert chromium is not None, "chromium is missing: run scripts/setup as root (Debian's chromium)"
    site = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        capture_output=True,
        check=True,
    )
    pages = sorted(p for p in site.rglob("index.html") if "404" not in str(p) and "search" not in p.parts)
    assert len(pages) >= 15
    overflowing = []
    for page in pages:
        html = page.read_text(encoding="utf-8")
        page.write_text(html.replace("</body>", _MEASURE + "</body>"), encoding="utf-8")
        dom = subprocess.run(
            [
                chromium, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1280,900",
                "--virtual-time-budget=2000", "--dump-dom", page.as_uri(),
            ],
            capture_output=True, text=True, timeout=90, check=True,
        ).stdout  # fmt: skip
        found = _VERDICT.search(dom)
        assert found is not None, f"{page}: the measuring script did not run"
        page_overflow = found.group(1) or found.group(4)
        wide = int(found.group(2) or found.group(3))
        if page_overflow == "true" or wide:
            overflowing.append(
                f"{page.relative_to(site)}: page wider than the window={page_overflow}, tables {wide}"
            )
    assert overflowing == []
