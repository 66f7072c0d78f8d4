"""glibc's malloc arenas for a run's threads: at most ARENAS, unless MALLOC_ARENA_MAX is set already.

A run's threads (the reader, the model stage, two COPY writers, the recorder) each allocate and free a
shard's buffers by the megabyte, and glibc gives every thread an arena of its own (up to 8 per core) from
which freed memory is seldom returned: the peak RSS of a one-process run grew by 16 % from 1M to 10M
documents while its count of Python objects stayed flat. With two arenas it grew by 7 %, at no CPU cost
measured (a 10M run: user 2 min 14 s against 2 min 12 s, system 17.8 s against 15.9 s; a threshold for mmap
instead cost 43 s more of system time, and `malloc_trim` after each shard 13 s). Set with `mallopt` for this
process, and in the environment for the processes it starts (the processes engine's fork server, Ray's
workers), whose glibc reads it when they start.
"""

from __future__ import annotations

import ctypes
import os
import platform
from contextlib import suppress

ARENAS = 2
M_ARENA_MAX = -8  # glibc's malloc.h


def limit_malloc_arenas() -> None:
    if "MALLOC_ARENA_MAX" in os.environ or platform.libc_ver()[0] != "glibc":
        return
    os.environ["MALLOC_ARENA_MAX"] = str(ARENAS)
    with suppress(OSError, AttributeError):
        ctypes.CDLL(None).mallopt(M_ARENA_MAX, ARENAS)
