"""Loaders on each rank: a DistributedSampler to train, an exact shard (no padding) to evaluate.

Training uses ``torch.utils.data.DistributedSampler``: one permutation per epoch (``set_epoch``),
the same on every rank, rank r taking positions r, r+W, r+2W, ... of it. Batch i of the W ranks
together is then exactly batch i of one process with a W times larger batch: N ranks equal one
process on the full batch. To give every rank the same number of batches it pads the last
round with repeated samples (or drops the tail with ``drop_last``); harmless for training.

Evaluation must not count a sample twice, so it uses :class:`ShardSampler`: contiguous,
disjoint shards covering the set exactly once, sizes differing by at most one. Concatenated
in rank order they are the set in its own order.

A ``TensorDataset`` with torch's default collate is indexed a batch at a time (one gather per
tensor instead of a Python call per sample and a stack): the same batches, about a third of
the cost per batch.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from torch.utils.data import BatchSampler, DataLoader, DistributedSampler, Sampler, TensorDataset

if TYPE_CHECKING:
    from ddprl.supervised.config import SupervisedConfig


class ShardSampler(Sampler[int]):
    """Indices ``[r*N//W, (r+1)*N//W)`` of a set of ``num_samples``: every sample exactly once over ranks."""

    def __init__(self, num_samples: int, rank: int, world_size: int):
        self.start = rank * num_samples // world_size
        self.stop = (rank + 1) * num_samples // world_size

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.start, self.stop))

    def __len__(self) -> int:
        return self.stop - self.start


class EpochSampler(DistributedSampler):
    """``DistributedSampler`` that can start an epoch part-way: ``start_at(epoch, n)`` skips the
    epoch's first ``n`` samples of this rank (a job stopped mid-epoch resumes where it was)."""

    skip = 0

    def start_at(self, epoch: int, samples: int = 0) -> None:
        self.set_epoch(epoch)  # a new permutation every epoch, the same on every rank
        self.skip = samples

    def __iter__(self) -> Iterator[int]:
        return itertools.islice(super().__iter__(), self.skip, None)

    def __len__(self) -> int:
        return super().__len__() - self.skip


def start_epoch(loader: DataLoader, epoch: int, samples: int = 0) -> None:
    """Start ``epoch`` of a :func:`train_loader`, skipping this rank's first ``samples`` of it."""
    sampler = loader.sampler if isinstance(loader.sampler, EpochSampler) else loader.sampler.sampler
    sampler.start_at(epoch, samples)


def _loader(
    dataset: Any, sampler: Sampler, batch_size: int, drop_last: bool, cfg: SupervisedConfig, collate_fn: Any
) -> DataLoader:
    kwargs: dict[str, Any] = {"num_workers": cfg.num_workers, "pin_memory": cfg.pin_memory}
    if cfg.num_workers > 0:
        kwargs["persistent_workers"] = True  # no worker start-up cost every epoch
        if cfg.prefetch_factor is not None:
            kwargs["prefetch_factor"] = cfg.prefetch_factor
    if collate_fn is None and type(dataset) is TensorDataset:
        # dataset[indices] of the batch's indices: the tensors' rows at once. As a list, as the default collate gives.
        batches = BatchSampler(sampler, batch_size, drop_last)
        return DataLoader(dataset, batch_size=None, sampler=batches, collate_fn=list, **kwargs)
    return DataLoader(dataset, batch_size, sampler=sampler, drop_last=drop_last, collate_fn=collate_fn, **kwargs)


def train_loader(dataset: Any, cfg: SupervisedConfig, rank: int, world_size: int, collate_fn: Any = None) -> DataLoader:
    """This rank's training batches of ``batch_size``; call :func:`start_epoch` every epoch."""
    sampler = EpochSampler(
        dataset, num_replicas=world_size, rank=rank, shuffle=cfg.shuffle, seed=cfg.seed, drop_last=cfg.drop_last
    )
    return _loader(dataset, sampler, cfg.batch_size, cfg.drop_last, cfg, collate_fn)


def eval_loader(dataset: Any, cfg: SupervisedConfig, rank: int, world_size: int, collate_fn: Any = None) -> DataLoader:
    """This rank's shard of an evaluation set: every sample counted once over the ranks."""
    sampler = ShardSampler(len(dataset), rank, world_size)
    return _loader(dataset, sampler, cfg.eval_batch_size or cfg.batch_size, False, cfg, collate_fn)
