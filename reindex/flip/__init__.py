"""The alias move and what follows it: cutover with its checks, and sync of changes since the run."""

from __future__ import annotations
