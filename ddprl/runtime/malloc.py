"""``malloc=keep``: glibc's allocator keeps the memory a rank frees, for the rank's next step.

A training step on a CPU allocates and frees the same large tensors every time (activations,
their gradients, optimizer temporaries). By default glibc returns blocks above a moving
threshold to the kernel at once (``munmap``, and heap trimming), so the next step gets them
back as fresh zeroed pages, one page fault per 4 kB. Raising the mmap threshold to glibc's
ceiling and the trim threshold and top pad far above a step's churn keeps them in the process
(docs/benchmarks.md, "malloc").
"""

from __future__ import annotations

import ctypes

# mallopt's parameter numbers (glibc's malloc.h)
M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD = -1, -2, -3
SETTINGS = (
    (M_MMAP_THRESHOLD, 32 << 20),  # glibc's ceiling on 64-bit (HEAP_MAX_SIZE / 2); above it, mmap anyway
    (M_TRIM_THRESHOLD, 1 << 30),  # free memory at the heap's top kept up to 1 GiB
    (M_TOP_PAD, 64 << 20),  # the heap grows 64 MiB at a time
)


def keep_freed_memory() -> bool:
    """Set the C library's malloc to keep freed memory for reuse, for the whole process and the
    rest of its life. False where the C library has no such settings (musl, macOS)."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return all(mallopt(option, value) == 1 for option, value in SETTINGS)
