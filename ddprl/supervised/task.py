"""What a supervised job learns: :class:`Task` gathers the factories every rank calls.

Factories, not objects: every rank builds its own model and datasets (DDP then broadcasts rank
0's weights), and spawned processes receive functions, not gigabytes of pickled data.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import torch


def default_split(batch: Any) -> tuple[Any, torch.Tensor]:
    """``(inputs, target)`` of a batch collated from ``(x, y)`` samples."""
    inputs, target = batch
    return inputs, target


@dataclasses.dataclass
class Task:
    """A model to train, its loss, its data and how to measure it.

    model:   ``() -> nn.Module`` (called once on every rank).
    loss:    ``(output, target) -> scalar``, the *mean* over the batch (e.g. ``nn.CrossEntropyLoss()``).
    train / val / test: ``() -> Dataset`` (a map-style dataset: ``len`` and indexing). ``val``
             decides early stopping and best.pt; ``test`` is measured once at the end, on the best
             weights. Either may be None.
    metrics: name -> a function ``(output, target) -> one value per sample`` (its mean over the
             whole set is the metric), or a torchmetrics ``Metric`` (its own reduction). ``loss``
             is always measured.
    collate_fn: how samples become a batch (None: torch's default); ``split_batch`` turns a batch
             into ``(inputs, target)`` for ``model(inputs)`` (graphs: ``lambda b: (b, b.y)``).
    """

    model: Callable[[], torch.nn.Module]
    loss: Callable[[Any, torch.Tensor], torch.Tensor]
    train: Callable[[], Any] | None = None
    val: Callable[[], Any] | None = None
    test: Callable[[], Any] | None = None
    metrics: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    collate_fn: Callable[[list], Any] | None = None
    split_batch: Callable[[Any], tuple[Any, torch.Tensor]] = default_split
    # Factories replacing the config's optimizer / scheduler keys (Trainer(optimizer=..., scheduler=...)):
    # optimizer(params) -> Optimizer; scheduler(optimizer, total_steps) -> LRScheduler stepped per optimizer step.
    optimizer: Callable[..., torch.optim.Optimizer] | None = None
    scheduler: Callable[..., Any] | None = None
    description: str = ""


def to_device(obj: Any, device: torch.device, non_blocking: bool = False) -> Any:
    """Move a batch to ``device``: tensors, (nested) tuples/lists/dicts, or anything with ``.to``."""
    if isinstance(obj, torch.Tensor) or hasattr(obj, "to") and callable(obj.to):
        return obj.to(device, non_blocking=non_blocking)
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_device(o, device, non_blocking) for o in obj)
    if isinstance(obj, dict):
        return {k: to_device(v, device, non_blocking) for k, v in obj.items()}
    return obj


def batch_len(target: Any) -> int:
    """Samples in a batch: the length of its target along dim 0."""
    return int(target.shape[0]) if isinstance(target, torch.Tensor) and target.dim() > 0 else len(target)
