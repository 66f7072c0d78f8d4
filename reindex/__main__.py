"""`python -m reindex` runs the CLI."""

from __future__ import annotations

from reindex.cli import main

main()
