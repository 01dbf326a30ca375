"""Small helpers every algorithm's loop uses the same way."""

from __future__ import annotations

import contextlib

import torch


def autocast_context(device: torch.device, precision: str) -> contextlib.AbstractContextManager:
    """Mixed precision for forward passes: bf16/fp16 autocast, or nothing for fp32 and tf32 (whose
    TF32 matrix products are a process setting: :func:`ddprl.runtime.launch.float32_matmuls`)."""
    if precision in ("fp32", "tf32"):
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16 if precision == "bf16" else torch.float16)


def crossed(step: int, stride: int, every: int) -> bool:
    """True when ``step`` just passed a multiple of ``every`` (steps advance by ``stride``).

    Every rank has the same global ``step``, so every rank takes the same decision: the
    collectives behind logging, evaluation and checkpoints stay matched.
    """
    return every > 0 and (step // every) > ((step - stride) // every)
