"""run."""

from __future__ import annotations
