"""Tasks shipped with ddprl (no download), and ``task=module:function`` for a user's own.

    digits          scikit-learn's bundled 8x8 digits (1,797 images, 10 classes), an MLP
    breast_cancer   scikit-learn's Wisconsin breast cancer set (569 x 30, 2 classes), an MLP
    graph_energy    graph-level regression on generated particle graphs, a small GNN
                    (torch_geometric, the ``graph`` extra): ``ddprl.supervised.graph``

A task function takes the job config and returns a :class:`~ddprl.supervised.Task`; its options
come from ``task_options`` (e.g. ``task_options.split_seed=3``). The split into train / val /
test is fixed by ``split_seed`` (not ``seed``): changing the training seed never moves a sample
between splits.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from ddprl.errors import UsageError
from ddprl.supervised.metrics import accuracy, mae, mse
from ddprl.supervised.names import SHIPPED, check_task_name, is_user_task
from ddprl.supervised.task import Task

if TYPE_CHECKING:
    from ddprl.supervised.config import SupervisedConfig


def task_function(name: str) -> Callable[[Any], Task]:
    """The function behind a task name; a UsageError a user can act on when it cannot be imported."""
    check_task_name(name)
    module_name, _, function = SHIPPED.get(name, name).partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        if name in SHIPPED:
            raise UsageError(
                f"task={name} needs a package that is not installed ({e.name}): "
                f"pip install 'ddprl[{'graph' if name == 'graph_energy' else 'supervised'}]'"
            ) from None
        raise UsageError(f"task={name}: cannot import module {module_name!r} ({e})") from None
    fn = getattr(module, function, None)
    if not callable(fn):
        raise UsageError(f"task={name}: module {module_name!r} has no function {function!r}")
    return fn


def load_task(cfg: SupervisedConfig) -> Task:
    """The :class:`Task` of ``cfg.task`` (every rank calls it; keep task functions cheap and deterministic)."""
    task = task_function(cfg.task)(cfg)
    if not isinstance(task, Task):
        raise UsageError(f"task={cfg.task} returned a {type(task).__name__}, not a ddprl.supervised.Task")
    return task


# -- networks ----------------------------------------------------------------------------------


def mlp(in_features: int, hidden_sizes: list[int], out_features: int) -> nn.Sequential:
    """Linear layers with ReLU between them."""
    layers: list[nn.Module] = []
    width = in_features
    for hidden in hidden_sizes:
        layers += [nn.Linear(width, hidden), nn.ReLU()]
        width = hidden
    layers.append(nn.Linear(width, out_features))
    return nn.Sequential(*layers)


# -- tabular tasks from scikit-learn -----------------------------------------------------------

SPLIT_FRACTIONS = (0.7, 0.15, 0.15)


@functools.lru_cache(maxsize=4)
def _tabular_splits(name: str, split_seed: int) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Standardised (x, y) per split of a scikit-learn bundled set; the same on every rank."""
    try:
        from sklearn import datasets
    except ImportError:
        raise UsageError(f"task={name} needs scikit-learn: pip install 'ddprl[supervised]'") from None
    data = {"digits": datasets.load_digits, "breast_cancer": datasets.load_breast_cancer}[name]()
    x = torch.as_tensor(data.data, dtype=torch.float32)
    y = torch.as_tensor(data.target, dtype=torch.long)
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(split_seed))
    n_train = int(SPLIT_FRACTIONS[0] * len(x))
    n_val = int(SPLIT_FRACTIONS[1] * len(x))
    parts = {"train": order[:n_train], "val": order[n_train : n_train + n_val], "test": order[n_train + n_val :]}
    mean, std = x[parts["train"]].mean(0), x[parts["train"]].std(0).clamp_min(1e-6)  # training statistics only
    return {split: ((x[idx] - mean) / std, y[idx]) for split, idx in parts.items()}


def _tensor_dataset(name: str, split_seed: int, split: str) -> torch.utils.data.TensorDataset:
    return torch.utils.data.TensorDataset(*_tabular_splits(name, split_seed)[split])


def _tabular_task(name: str, cfg: SupervisedConfig, in_features: int, classes: int) -> Task:
    options = dict(cfg.task_options)
    split_seed = int(options.pop("split_seed", 0))
    if options:
        raise UsageError(f"task={name} has no option(s) {', '.join(options)}; it takes split_seed")
    data = functools.partial(_tensor_dataset, name, split_seed)
    return Task(
        model=functools.partial(mlp, in_features, list(cfg.hidden_sizes), classes),
        loss=nn.CrossEntropyLoss(),
        train=functools.partial(data, "train"),
        val=functools.partial(data, "val"),
        test=functools.partial(data, "test"),
        metrics={"accuracy": accuracy},
        description=f"scikit-learn {name}, {SPLIT_FRACTIONS} split by split_seed={split_seed}",
    )


def digits(cfg: SupervisedConfig) -> Task:
    """8x8 handwritten digits: 1,257 / 269 / 271 samples, 64 features, 10 classes."""
    return _tabular_task("digits", cfg, 64, 10)


def breast_cancer(cfg: SupervisedConfig) -> Task:
    """Wisconsin breast cancer: 398 / 85 / 86 samples, 30 features, malignant vs benign."""
    return _tabular_task("breast_cancer", cfg, 30, 2)


__all__ = [
    "SHIPPED",
    "load_task",
    "check_task_name",
    "task_function",
    "is_user_task",
    "digits",
    "breast_cancer",
    "mlp",
    "accuracy",
    "mse",
    "mae",
]
