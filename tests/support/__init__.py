"""Helpers the tests build on: real artefacts made at test time (a tiny model, sample files)."""

from __future__ import annotations
