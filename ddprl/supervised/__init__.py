"""Supervised training on N ranks: :class:`Trainer` for any torch model and dataset, ``algo=supervised``.

    from ddprl.supervised import Trainer
    result = Trainer(model=make_net, loss=nn.CrossEntropyLoss(), train=train_set, val=val_set,
                     test=test_set, metrics=["accuracy"], world_size=2, epochs=20).fit()

Pieces: ``task`` (Task: the factories), ``data`` (DistributedSampler / exact eval shards),
``metrics`` (exact distributed evaluation), ``early_stopping``, ``loop`` (the training loop),
``trainer`` (the Python API and ``ddprl eval``), ``tasks`` / ``graph`` (shipped examples).
"""

from pathlib import Path

from ddprl.registry import Algorithm
from ddprl.supervised.config import SupervisedConfig

ALGORITHM = Algorithm(
    name="supervised",
    config=SupervisedConfig,
    train="ddprl.supervised.loop:train",
    defaults=Path(__file__).with_name("defaults.yaml"),
    architecture_keys=("hidden_sizes", "task_options"),
    prepare="ddprl.supervised.trainer:prepare_cli",
    eval_checkpoint="ddprl.supervised.trainer:eval_cli",
    description="any torch model and dataset: exact distributed metrics, early stopping (Trainer API)",
)

_LAZY = {
    "Trainer": "trainer",
    "FitResult": "trainer",
    "Task": "task",
    "EarlyStopping": "early_stopping",
    "accuracy": "metrics",
    "mse": "metrics",
    "mae": "metrics",
}


def __getattr__(name: str):
    # Lazy: `ddprl keys` reads ALGORITHM without importing torch.
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"ddprl.supervised.{_LAZY[name]}"), name)
    raise AttributeError(name)


__all__ = ["ALGORITHM", "SupervisedConfig", *_LAZY]
