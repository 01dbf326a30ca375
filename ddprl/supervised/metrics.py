"""Metrics over a whole evaluation set, exact over ranks.

A metric is either a function ``(output, target) -> one value per sample`` whose mean over the
whole set is the metric (summed on each rank's shard, the sums and the sample count reduced,
then divided: equal to one process on the whole set), or a torchmetrics ``Metric`` (updated on
each rank's shard; its ``compute`` gathers the states of all ranks itself, uneven shards
included). The loss is always measured, as the sample-weighted mean of the batch losses.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import torch

from ddprl.supervised.task import Task, batch_len, to_device

if TYPE_CHECKING:
    from ddprl.runtime.collectives import Runtime


def accuracy(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """1 where the predicted class is the target: argmax of class logits, or logit > 0 for one output."""
    if output.dim() > 1 and output.shape[-1] > 1:
        predicted = output.argmax(-1)
    else:
        predicted = (output.reshape(len(output)) > 0).long()
    return (predicted == target.reshape(predicted.shape)).double()


def mse(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Squared error per sample (averaged over output dimensions)."""
    return ((output.double() - target.double().reshape(output.shape)) ** 2).reshape(len(output), -1).mean(1)


def mae(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Absolute error per sample (averaged over output dimensions)."""
    return (output.double() - target.double().reshape(output.shape)).abs().reshape(len(output), -1).mean(1)


BUILTIN_METRICS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "accuracy": accuracy,
    "mse": mse,
    "mae": mae,
}


def is_torchmetric(metric: Any) -> bool:
    """A torchmetrics-style object (update / compute / reset) rather than a per-sample function."""
    return all(callable(getattr(metric, name, None)) for name in ("update", "compute", "reset"))


@torch.no_grad()
def evaluate(
    rt: Runtime,
    model: torch.nn.Module,
    loader: Any,
    task: Task,
    prefix: str,
    autocast: contextlib.AbstractContextManager | None = None,
) -> dict[str, float]:
    """``{prefix}/loss``, ``{prefix}/<metric>`` and ``{prefix}/num_samples`` over the whole set (collective)."""
    was_training = model.training
    model.eval()
    functions = {n: m for n, m in task.metrics.items() if not is_torchmetric(m)}
    objects = {n: m.to(rt.device) if hasattr(m, "to") else m for n, m in task.metrics.items() if is_torchmetric(m)}
    for metric in objects.values():
        metric.reset()
    # Sums stay on the device until the end: no host sync per batch.
    sums = {name: torch.zeros((), dtype=torch.float64, device=rt.device) for name in ("loss", *functions)}
    num_samples = 0
    for batch in loader:
        inputs, target = task.split_batch(to_device(batch, rt.device, non_blocking=True))
        with autocast or contextlib.nullcontext():
            output = model(inputs)
        if output.is_floating_point():
            output = output.float()  # metrics in fp32 whatever the autocast
        n = batch_len(target)
        sums["loss"] += task.loss(output, target).double() * n
        for name, fn in functions.items():
            sums[name] += fn(output, target).double().sum()
        for metric in objects.values():
            metric.update(output, target)
        num_samples += n
    totals = rt.all_reduce_sum({**sums, "num_samples": float(num_samples)})
    count = totals.pop("num_samples")
    result = {f"{prefix}/{name}": value / count for name, value in totals.items()}
    for name, metric in objects.items():
        result[f"{prefix}/{name}"] = float(metric.compute())  # torchmetrics reduces over ranks itself
    result[f"{prefix}/num_samples"] = count
    model.train(was_training)
    return result


def resolve_metrics(metrics: Mapping[str, Any] | list[str]) -> dict[str, Any]:
    """Metric names (built-ins) or a mapping name -> function/torchmetric, as a mapping."""
    if isinstance(metrics, Mapping):
        return dict(metrics)
    unknown = [m for m in metrics if m not in BUILTIN_METRICS]
    if unknown:
        from ddprl.errors import UsageError

        raise UsageError(f"unknown metric(s) {', '.join(unknown)}; built in: {', '.join(BUILTIN_METRICS)}")
    return {m: BUILTIN_METRICS[m] for m in metrics}
