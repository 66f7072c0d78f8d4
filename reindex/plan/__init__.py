"""Before a run: the estimate (documents, tokens, ETA, storage) and the cost/deadline routing of embedders."""

from __future__ import annotations
