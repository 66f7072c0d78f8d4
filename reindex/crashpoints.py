"""Named points where the tool kills itself with SIGKILL, for crash tests: REINDEX_CRASH_AT=<name>[:<n>].

`after_embed:3` dies the third time the run reaches `after_embed`. Unset in production: one dict lookup.
With REINDEX_CRASH_ONCE=<path> as well, only the first process to get there dies (it creates <path>):
a Ray actor that is restarted after the crash does not crash again. REINDEX_CRASH_HOW=hang: it stalls
there instead of dying.
"""

from __future__ import annotations

import os
import signal
import time

POINTS = (
    "after_embed",  # vectors computed, nothing written
    "mid_write",  # half of a shard's rows written
    "after_write",  # rows durable, shard not yet marked in the ledger
    "before_finalize",  # every row written and recorded, the target not yet finalized
    "cutover_after_intent",  # intent recorded, alias untouched
    "cutover_before_commit",  # inside the sink's swap, before it commits (adapters call it)
    "cutover_after_move",  # alias moved, history not yet settled
    "job_after_intent",  # provider job intent durable, nothing created
    "job_after_create",  # provider job created, its id not yet in the ledger
    "job_after_write",  # a finished job's vectors durable, job not yet marked applied
    "job_after_apply",  # job applied, provider files not yet released
    "model_process",  # a model process (the processes engine) about to launch a batch
)
_hits: dict[str, int] = {}


def armed(name: str) -> bool:
    """True when this call of point `name` is the one chosen to die."""
    spec = os.environ.get("REINDEX_CRASH_AT")
    if not spec:
        return False
    point, _, nth = spec.partition(":")
    if point != name:
        return False
    _hits[name] = _hits.get(name, 0) + 1
    if _hits[name] != int(nth or 1):
        return False
    once = os.environ.get("REINDEX_CRASH_ONCE")
    if once:
        try:
            os.close(os.open(once, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return False
    return True


def crash_if_armed(name: str) -> None:
    if armed(name):
        die()


def die() -> None:
    """SIGKILL; with REINDEX_CRASH_HOW=hang, never return instead (a process that stalls: a hung driver
    call, a GPU that stopped answering), for the tests of what waits on it."""
    if os.environ.get("REINDEX_CRASH_HOW") == "hang":
        while True:
            time.sleep(3600)
    os.kill(os.getpid(), signal.SIGKILL)
