"""The supervised Trainer's keys (values: ``defaults.yaml`` beside this file). ``ddprl keys algo=supervised``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from ddprl.config.schema import JobConfig, _check, key


@dataclass(kw_only=True)
class SupervisedConfig(JobConfig):
    """A supervised job: a task (model, loss, data, metrics), epochs, validation, early stopping."""

    task: str = key(
        "digits | breast_cancer | graph_energy (torch_geometric) | module:function returning a "
        "ddprl.supervised.Task; from Python (Trainer) a label only"
    )
    task_options: dict[str, Any] = key("keyword arguments for the task function (sizes, split seed, ...)")
    hidden_sizes: list[int] = key("hidden layer widths of the shipped tasks' networks")
    epochs: int = key("passes over the training set (the run may stop earlier: patience)")
    # -- optimiser --------------------------------------------------------------------------
    optimizer: str = key("adam | adamw | sgd (a Trainer's optimizer factory replaces it)")
    lr: float = key("learning rate")
    weight_decay: float = key("weight decay (decoupled for adamw)")
    momentum: float = key("SGD momentum")
    scheduler: str = key("none | cosine (to 0 over all epochs, stepped per optimizer step)")
    max_grad_norm: float = key("clip the global gradient norm to this (0: off)")
    # -- data -------------------------------------------------------------------------------
    shuffle: bool = key("shuffle the training set (DistributedSampler: a new permutation every epoch)")
    drop_last: bool = key("drop the last incomplete training batch (and the padding DistributedSampler adds)")
    eval_batch_size: Optional[int] = key("samples per evaluation batch on each rank (null: batch_size)")
    num_workers: int = key("DataLoader worker processes on each rank")
    pin_memory: bool = key("page-locked host batches (faster copies to a GPU)")
    prefetch_factor: Optional[int] = key(
        "batches each worker loads ahead (null: torch's default; needs num_workers > 0)"
    )
    # -- validation, early stopping, checkpoints ---------------------------------------------
    eval_freq: int = key("validate every this many epochs (the last epoch always)")
    monitor: str = key(
        "metric deciding early stopping and best.pt, e.g. val/accuracy (auto: val/loss, "
        "or train/loss without a validation set)"
    )
    mode: str = key("min | max: whether a lower or a higher monitored value is better")
    patience: int = key("stop after this many validations without improvement (0: never stop early)")
    min_delta: float = key("an improvement must beat the best by more than this")
    checkpoint_freq: int = key(
        "checkpoint every this many epochs (0: only the end); an improvement of the "
        "monitored metric always saves (best.pt)"
    )
    log_freq: int = key("log training metrics every this many optimizer steps (0: once per epoch)")

    def __post_init__(self) -> None:
        super().__post_init__()
        _check(self.epochs >= 1, f"epochs={self.epochs} must be >= 1")
        _check(
            all(isinstance(h, int) and h >= 1 for h in self.hidden_sizes),
            f"hidden_sizes={self.hidden_sizes} must be widths >= 1, e.g. [128, 128]",
        )
        _check(self.lr > 0, f"lr={self.lr} must be > 0")
        _check(self.weight_decay >= 0, f"weight_decay={self.weight_decay} must be >= 0")
        _check(
            self.optimizer in ("adam", "adamw", "sgd"), f"optimizer={self.optimizer!r} is not one of adam, adamw, sgd"
        )
        _check(self.scheduler in ("none", "cosine"), f"scheduler={self.scheduler!r} is not none or cosine")
        _check(self.max_grad_norm >= 0, f"max_grad_norm={self.max_grad_norm} must be >= 0")
        _check(
            self.eval_batch_size is None or self.eval_batch_size >= 1,
            f"eval_batch_size={self.eval_batch_size} must be >= 1 or null",
        )
        _check(self.num_workers >= 0, f"num_workers={self.num_workers} must be >= 0")
        _check(
            self.prefetch_factor is None or self.prefetch_factor >= 1,
            f"prefetch_factor={self.prefetch_factor} must be >= 1 or null",
        )
        _check(
            self.prefetch_factor is None or self.num_workers > 0,
            f"prefetch_factor={self.prefetch_factor} needs num_workers > 0 (no workers load ahead)",
        )
        _check(self.eval_freq >= 1, f"eval_freq={self.eval_freq} must be >= 1")
        _check(self.mode in ("min", "max"), f"mode={self.mode!r} is not min or max")
        _check(self.patience >= 0, f"patience={self.patience} must be >= 0")
        _check(self.min_delta >= 0, f"min_delta={self.min_delta} must be >= 0")
        _check(self.checkpoint_freq >= 0, f"checkpoint_freq={self.checkpoint_freq} must be >= 0")
        _check(self.log_freq >= 0, f"log_freq={self.log_freq} must be >= 0")
        _check(
            self.monitor == "auto" or self.monitor.startswith(("val/", "train/")),
            f"monitor={self.monitor!r} must name a val/ or train/ metric (e.g. val/loss)",
        )

    def check_task(self) -> None:
        from ddprl.supervised.names import check_task_name

        check_task_name(self.task)

    def run_name(self) -> str:
        return f"{self.algo}-{self.task.replace(':', '_').replace('/', '_').replace('.', '_')}"
