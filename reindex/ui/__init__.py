"""The command line: typer commands over reindex.commands, and the terminal's progress and tables."""

from __future__ import annotations
