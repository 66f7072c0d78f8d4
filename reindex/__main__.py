"""`python -m reindex` runs the CLI."""

from __future__ import annotations

from reindex.ui.cli import main

main()
