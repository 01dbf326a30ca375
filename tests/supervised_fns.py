"""Factories and rank functions for the supervised tests (module level: spawned ranks import them)."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import torch
from torch import nn

from ddprl.supervised import Task
from ddprl.supervised.metrics import accuracy, mae, mse


def blobs(n: int, seed: int = 0) -> torch.utils.data.TensorDataset:
    """``n`` samples of 6 features, 3 classes: a small classification set."""
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 3, (n,), generator=g)
    x = torch.randn(n, 6, generator=g) + 1.5 * nn.functional.one_hot(y, 6).float()
    return torch.utils.data.TensorDataset(x, y)


def small_mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))


def blob_task(n_train: int = 96, n_val: int = 37, n_test: int = 29) -> Task:
    return Task(
        model=small_mlp,
        loss=nn.CrossEntropyLoss(),
        train=functools.partial(blobs, n_train, 1),
        val=functools.partial(blobs, n_val, 2),
        test=functools.partial(blobs, n_test, 3),
        metrics={"accuracy": accuracy},
    )


def tiny_task(cfg) -> Task:
    """A task named on the command line as ``supervised_fns:tiny_task``."""
    return blob_task()


# -- early stopping on a set whose shards disagree ----------------------------------------------
# Train: x=1, y=1 pulls the weight w of y = w*x from 0 towards 1. Validation (20 samples): the
# first 10 (rank 0's shard of 2) have x=1, y=0, loss w^2, worse every epoch; the last 10 have
# x=3, y=3, loss 9(w-1)^2. The global loss (w^2 + 9(w-1)^2)/2 improves until w passes 0.9.


def ones_train() -> torch.utils.data.TensorDataset:
    return torch.utils.data.TensorDataset(torch.ones(16, 1), torch.ones(16, 1))


def disagreeing_val() -> torch.utils.data.TensorDataset:
    x = torch.cat([torch.ones(10, 1), 3 * torch.ones(10, 1)])
    y = torch.cat([torch.zeros(10, 1), 3 * torch.ones(10, 1)])
    return torch.utils.data.TensorDataset(x, y)


def zero_linear() -> nn.Module:
    net = nn.Linear(1, 1, bias=False)
    nn.init.zeros_(net.weight)
    return net


def sgd_factory(params, lr: float = 0.1):
    return torch.optim.SGD(params, lr=lr)


def disagreeing_task() -> Task:
    return Task(
        model=zero_linear,
        loss=nn.MSELoss(),
        train=ones_train,
        val=disagreeing_val,
        optimizer=sgd_factory,
        metrics={"mse": mse, "mae": mae},
    )


def fit_and_record(rt, cfg, task: Task, out: str) -> None:
    """Run the training loop on this rank and write what this rank saw."""
    from ddprl.supervised.loop import fit

    result = fit(rt, cfg, task)
    Path(out, f"rank{rt.rank}.json").write_text(
        json.dumps({"epochs": result.epochs, "stopped": result.stopped_early, "metrics": result.metrics})
    )


def evaluate_fixed(rt, cfg, task: Task, split: str, out: str) -> None:
    """Evaluate a fixed (seeded) model on this rank's shard; write the global result."""
    from ddprl.supervised.data import eval_loader
    from ddprl.supervised.metrics import evaluate

    torch.manual_seed(0)
    model = task.model()
    dataset = getattr(task, split)()
    result = evaluate(rt, model, eval_loader(dataset, cfg, rt.rank, rt.world_size), task, split)
    Path(out, f"rank{rt.rank}.json").write_text(json.dumps(result))


class SignalledLoss(nn.Module):
    """Cross-entropy that sends SIGTERM to its own process at its ``at``-th call on rank 1: a
    preemption notice reaching one rank mid-epoch, at a known point."""

    def __init__(self, at: int):
        super().__init__()
        self.at, self.calls = at, 0

    def forward(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        import os
        import signal

        import torch.distributed as dist

        self.calls += 1
        if self.calls == self.at and dist.get_rank() == 1:
            os.kill(os.getpid(), signal.SIGTERM)
        return nn.functional.cross_entropy(output, target)


def long_blob_task(signal_at: int = 0) -> Task:
    """300 micro-batches of 2 per rank and epoch (2 ranks): a stop lands mid-epoch."""
    return Task(
        model=small_mlp,
        loss=SignalledLoss(signal_at) if signal_at else nn.CrossEntropyLoss(),
        train=functools.partial(blobs, 1200, 1),
        val=functools.partial(blobs, 37, 2),
        metrics={"accuracy": accuracy},
    )
