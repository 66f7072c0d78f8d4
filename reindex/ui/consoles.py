"""The two consoles the command line prints to: results on stdout (`out`), progress and errors on stderr
(`err`)."""

from __future__ import annotations

from rich.console import Console

out = Console(soft_wrap=True)
err = Console(stderr=True, soft_wrap=True)
