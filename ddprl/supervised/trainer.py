"""The Python API (:class:`Trainer`) and the command line's entry points for ``algo=supervised``.

``Trainer.fit()`` goes through the same steps as ``ddprl train``: config keys checked and
resolved (resume included), then ``launch`` spawns ``world_size`` processes, or attaches to
torchrun / srun when the script runs under them.
"""

from __future__ import annotations

import functools
import pickle
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ddprl.errors import UsageError
from ddprl.supervised.loop import FitResult
from ddprl.supervised.names import PYTHON_TASK, is_user_task
from ddprl.supervised.task import Task, default_split
from ddprl.supervised.tasks import load_task

if TYPE_CHECKING:
    from ddprl.runtime.collectives import Runtime
    from ddprl.supervised.config import SupervisedConfig


def _constant(value: Any) -> Any:
    return value


def _factory(data: Any) -> Callable[[], Any] | None:
    """A dataset factory: a callable as given, a dataset object wrapped (it travels to every rank)."""
    if data is None or (callable(data) and not hasattr(data, "__len__")):
        return data
    return functools.partial(_constant, data)


class Trainer:
    """Train any torch model on N ranks with exact distributed metrics and early stopping.

    model:     ``() -> nn.Module``, called on every rank (DDP then gives all rank 0's weights).
    loss:      ``(output, target) -> scalar`` averaged over the batch, e.g. ``nn.CrossEntropyLoss()``.
    train, val, test: datasets, or ``() -> Dataset`` factories (better for large data: each rank
               builds its own instead of receiving a pickled copy). Map-style: ``len`` and indexing.
    metrics:   built-in names (``accuracy``, ``mse``, ``mae``) or {name: function | torchmetrics Metric};
               a function returns one value per sample, the metric is their mean over the whole set.
    optimizer: ``params -> Optimizer`` (default: the ``optimizer``/``lr``/``weight_decay`` keys).
    scheduler: ``(optimizer, total_steps) -> LRScheduler``, stepped per optimizer step.
    collate_fn, split_batch: batch assembly and ``batch -> (inputs, target)`` (see Task).
    **keys:    any ``ddprl keys algo=supervised`` key: world_size, epochs, batch_size (per rank),
               sync_freq, precision, compile, monitor, mode, patience, run_dir, resume, ...

    Spawning (world_size > 1 outside torchrun) sends the factories to new processes: define them
    at module level (functions, classes, functools.partial), and guard the script's entry with
    ``if __name__ == "__main__":``.
    """

    def __init__(
        self,
        model: Callable[[], torch.nn.Module],
        loss: Callable[..., torch.Tensor],
        train: Any,
        val: Any = None,
        test: Any = None,
        metrics: Mapping[str, Any] | list[str] = (),
        optimizer: Callable[..., torch.optim.Optimizer] | None = None,
        scheduler: Callable[..., Any] | None = None,
        collate_fn: Callable[[list], Any] | None = None,
        split_batch: Callable[[Any], tuple[Any, torch.Tensor]] | None = None,
        **keys: Any,
    ):
        from ddprl.supervised.metrics import resolve_metrics

        self.task = Task(
            model=model,
            loss=loss,
            train=_factory(train),
            val=_factory(val),
            test=_factory(test),
            metrics=resolve_metrics(metrics),
            collate_fn=collate_fn,
            split_batch=split_batch or default_split,
            optimizer=optimizer,
            scheduler=scheduler,
        )
        self.keys = {"task": PYTHON_TASK, **keys, "algo": "supervised"}

    @classmethod
    def from_task(cls, task: Task, **keys: Any) -> Trainer:
        """A Trainer for a :class:`Task` built elsewhere (e.g. a shipped task function's)."""
        trainer = cls.__new__(cls)
        trainer.task, trainer.keys = task, {"task": PYTHON_TASK, **keys, "algo": "supervised"}
        return trainer

    def config(self) -> Any:
        """The job's resolved config (keys checked; resume resolved)."""
        from ddprl.prepare import prepare_train

        return prepare_train([], None, values=self.keys, prepare_hook=False)

    def fit(self) -> FitResult:
        """Train (spawning ranks, or as this rank under torchrun/srun); returns the run's result."""
        from ddprl.runlock import run_dir_held
        from ddprl.runtime import launch, runs_in_this_process
        from ddprl.supervised.loop import fit, monitored

        cfg = self.config()
        monitored(cfg, self.task)
        if runs_in_this_process(cfg):
            with run_dir_held(cfg) as cfg:  # one job per run directory
                return launch(functools.partial(fit, task=self.task), cfg)
        _check_picklable(self.task)
        # run_dir_held names a default run directory here, so this process knows where the ranks wrote
        with run_dir_held(cfg) as cfg:
            launch(functools.partial(fit, task=self.task), cfg)
        return FitResult.from_run_dir(cfg.run_dir)

    def test(self, checkpoint: str | Path, split: str = "test", device: str = "auto") -> dict[str, float]:
        """Metrics of ``checkpoint`` on ``split`` (test | val | train), in this one process."""
        return evaluate_checkpoint(checkpoint, self.task, split=split, device=device)


def _check_picklable(task: Task) -> None:
    try:
        pickle.dumps(task)
    except Exception as e:  # lambdas, local functions, open handles...
        raise UsageError(
            f"the Trainer's factories cannot be sent to spawned ranks ({type(e).__name__}: {e}); "
            f"define them at module level (functions or functools.partial), or run the script "
            f"under torchrun"
        ) from None


def evaluate_checkpoint(
    checkpoint: str | Path, task: Task, split: str = "test", device: str = "auto", batch_size: int | None = None
) -> dict[str, float]:
    """``{split}/loss``, ``{split}/<metric>``, ``{split}/num_samples`` of a checkpoint, in this process."""
    from ddprl.checkpoint import load_checkpoint
    from ddprl.config import load_config
    from ddprl.runtime import launch

    if split not in ("train", "val", "test"):
        raise UsageError(f"split={split!r} is not one of test, val, train")
    if getattr(task, split) is None:
        raise UsageError(f"the task has no {split} set")
    ckpt = load_checkpoint(checkpoint, expect_algo="supervised")
    from ddprl.prepare import NOT_RESUMED

    saved = {k: v for k, v in ckpt["config"].items() if k not in NOT_RESUMED}
    values = {"world_size": 1, "nnodes": 1, "progress": False, "device": device}
    if batch_size is not None:
        values["eval_batch_size"] = batch_size
    cfg = load_config(resumed=saved, values=values)
    return launch(functools.partial(_evaluate_rank, task=task, state=ckpt["state"]["model"], split=split), cfg)


def _evaluate_rank(
    rt: Runtime, cfg: SupervisedConfig, task: Task, state: dict[str, Any], split: str
) -> dict[str, float]:
    from ddprl.algos.common import autocast_context
    from ddprl.supervised.data import eval_loader
    from ddprl.supervised.metrics import evaluate

    model = task.model()
    model.load_state_dict(state)
    model.to(rt.device)
    loader = eval_loader(getattr(task, split)(), cfg, rt.rank, rt.world_size, task.collate_fn)
    return evaluate(rt, model, loader, task, split, autocast_context(rt.device, cfg.precision))


# -- the command line ------------------------------------------------------------------------


def prepare_cli(
    cfg: SupervisedConfig, overrides: list[str], config_name: str | None, resumed: bool
) -> SupervisedConfig:
    """``ddprl train algo=supervised``: the task must be importable now, and user code named now.

    A checkpoint's stored config never makes ddprl import a module: resuming a run of
    ``task=module:function`` needs ``task=`` on the command line again.
    """
    if resumed and is_user_task(cfg.task) and not any(o.startswith("task=") for o in overrides):
        raise UsageError(
            f"resume: the checkpoint was trained with task={cfg.task} (your code); ddprl does not "
            f"import code named in a checkpoint: add task={cfg.task} to the command"
        )
    from ddprl.supervised.loop import monitored

    monitored(cfg, load_task(cfg))  # imports it: a missing module or extra fails here, before any rank starts
    return cfg


def eval_cli(ckpt: dict[str, Any], args: list[str]) -> int:
    """``ddprl eval checkpoint=PATH [split=test] [device=auto] [batch_size=N] [task=module:function]``."""
    from ddprl.config import load_config
    from ddprl.prepare import key_values

    kv = key_values(args, {"checkpoint": str, "split": str, "device": str, "batch_size": int, "task": str}, "eval")
    stored = ckpt["config"]["task"]
    if stored == PYTHON_TASK and "task" not in kv:
        raise UsageError(
            "this checkpoint was trained from Python (Trainer): evaluate it with Trainer.test(checkpoint), "
            "or name its task here: task=module:function"
        )
    if is_user_task(stored) and "task" not in kv:
        raise UsageError(
            f"the checkpoint was trained with task={stored} (your code); ddprl does not import code "
            f"named in a checkpoint: add task={stored} to confirm"
        )
    cfg = load_config(
        ["world_size=1"],
        resumed={**{k: v for k, v in ckpt["config"].items() if k != "task"}, "task": kv.get("task", stored)},
    )
    task = load_task(cfg)
    split = kv.get("split", "test")
    result = evaluate_checkpoint(
        kv["checkpoint"], task, split=split, device=kv.get("device", "auto"), batch_size=kv.get("batch_size")
    )
    print(
        " ".join(f"{k}={v:.6g}" if k != f"{split}/num_samples" else f"{k}={int(v)}" for k, v in result.items()),
        flush=True,
    )
    return 0
