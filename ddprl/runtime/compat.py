"""Features of the installed torch that ddprl adapts to (pyproject's floor: torch 2.4).

Detected from signatures, never from version strings: builds and backports disagree on
versions, not on what a function accepts.
"""

from __future__ import annotations

import functools
import inspect

from torch.nn.parallel import DistributedDataParallel


@functools.lru_cache(maxsize=None)
def ddp_accepts(keyword: str) -> bool:
    """Whether ``DistributedDataParallel(...)`` takes ``keyword`` in this torch."""
    return keyword in inspect.signature(DistributedDataParallel.__init__).parameters


def ddp_buffer_kwargs() -> tuple[dict[str, bool], bool]:
    """DDP keywords that sync buffers at construction only, never on forward.

    Returns ``(kwargs, broadcast_yourself)``. Newer torch (``forward_sync_buffers``, 2.13)
    separates the two syncs. Older torch has only ``broadcast_buffers``, and ``False`` there
    skips the construction-time broadcast too: the caller must broadcast the buffers itself.
    """
    if ddp_accepts("forward_sync_buffers"):
        return {"forward_sync_buffers": False}, False
    return {"broadcast_buffers": False}, True
