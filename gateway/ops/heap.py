"""The C heap's threshold for large blocks, fixed at start, so that large answers' memory goes back when freed.

glibc serves a block above its mmap threshold with a mapping of its own, returned to the system on free, but it
raises the threshold to the largest such block freed (up to 32 MiB). After the first large answer, large blocks
(an answer's bytes, the cache's copy of its text) come from the heap instead, and the holes the freed ones leave
pin the heap's pages. The threshold is fixed at 256 KiB (``mallopt(M_MMAP_THRESHOLD)``, which also stops it
moving); a block that large costs a map and an unmap, a few microseconds beside the copying it holds. A no-op
where the C library has no mallopt. Measured (tests/process/test_cache.py): docs/decisions/010-hostile-inputs.md.
"""

from __future__ import annotations

import ctypes
import ctypes.util

M_MMAP_THRESHOLD = -3  # glibc's malloc.h
LARGE_BLOCK_BYTES = 256 * 1024


def configure() -> bool:
    """Fix the mmap threshold at LARGE_BLOCK_BYTES; whether the C library took it. Call once at start."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(M_MMAP_THRESHOLD, LARGE_BLOCK_BYTES))
