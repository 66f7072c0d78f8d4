"""Proof of coverage: verify against the source, the quality comparison and gate, the source as served."""

from __future__ import annotations
