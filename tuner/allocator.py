"""The process's memory allocator told to keep large freed blocks for reuse.

A proposal round allocates temporaries of a few megabytes (a cross covariance of the training
points against a whole space, its exponential, the triangular solve's product) and frees
them before the next is made. glibc's malloc serves blocks that large from fresh mmaps, or
from the top of its heap and trims the heap as soon as two of them are free at once; either
way each new block is faulted in page by page, and the kernel zeroes every page. On this
project's VMs a page fault costs about 4 us: two 2.3 MB temporaries alive at once cost 2.2
ms to allocate against 0.05 ms reused, and the Matérn kernel over a 2,840-row space and 100
trials took 3.9 ms instead of 0.7 (benchmarks/RESULTS.md, "freed blocks kept").

`keep_freed_blocks` raises the mmap threshold to glibc's ceiling for its dynamic threshold
(32 MiB: larger blocks still come from mmap and go back when freed) and the trim threshold
to 128 MiB: a process that tunes keeps up to that much freed memory per malloc arena for its
next round instead of returning it and faulting it in again. It is process-wide, so only
what owns the process calls it (the service's start, the `pipetune` command, the
benchmarks), never a library import. Elsewhere than glibc it does nothing.
"""

from __future__ import annotations

import ctypes
import functools

# mallopt parameters (glibc's malloc.h).
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 32 * 1024 * 1024
TRIM_THRESHOLD_BYTES = 128 * 1024 * 1024


@functools.cache  # once per process: the settings are global and idempotent
def keep_freed_blocks() -> bool:
    """Set the thresholds (see the module's docstring); whether the allocator took them."""
    try:
        # The process's own symbols: libc is loaded already, so no library search (which
        # reads the linker's cache, 2 ms at every `pipetune` command's start).
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError, TypeError):  # no mallopt (macOS) or no CDLL(None)
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    # Setting either stops glibc adapting its mmap threshold; the trim threshold alone
    # would leave blocks over 128 KiB to fresh mmaps, slower than the defaults.
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)) and bool(
        mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES)
    )
