"""The supervised training loop, run on every rank: epochs of DDP steps, exact validation, early stopping.

    for epoch:
        train_one_epoch          # DistributedSampler.set_epoch(epoch); grads all-reduced once per
                                 # sync_freq micro-batches (no_sync before the last one); a stop
                                 # signal ends it after an optimizer step: saved mid-epoch, exit 75
        validate (every eval_freq epochs)      # exact over ranks: every sample once
        rank 0 decides: improved? stop?        # from the global metric, broadcast to all
        log one row, then save (improved, every checkpoint_freq epochs, last)   # best.pt / latest.pt
    test on the best weights (the last row carries them: it is logged after the last save)

The loop never touches the process group itself: it uses the Runtime's verbs (wrap, no_sync,
all_reduce_sum, broadcast_object) and ddprl.run.Run for the run directory and checkpoints.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import math
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.data import DataLoader

from ddprl.algos.common import autocast_context
from ddprl.checkpoint import state_of
from ddprl.errors import UsageError
from ddprl.run import Run
from ddprl.supervised.data import eval_loader, start_epoch, train_loader
from ddprl.supervised.early_stopping import EarlyStopping
from ddprl.supervised.metrics import evaluate
from ddprl.supervised.task import Task, batch_len, to_device
from ddprl.timesplit import TimeSplit

if TYPE_CHECKING:
    from ddprl.runtime.collectives import Runtime
    from ddprl.supervised.config import SupervisedConfig

log = logging.getLogger("ddprl")


@dataclasses.dataclass
class FitResult:
    """What a finished ``fit`` leaves: its directory, its last logged row, best.pt."""

    run_dir: Path
    metrics: dict[str, float]  # the last row: epoch, train/*, val/* and test/* (best weights)
    epochs: int
    stopped_early: bool
    best_checkpoint: Path | None

    @classmethod
    def from_run_dir(cls, run_dir: str | Path) -> FitResult:
        from ddprl.metrics import read_metrics

        run_dir = Path(run_dir).resolve()
        rows = [r for r in read_metrics(run_dir) if "epoch" in r]
        last = rows[-1] if rows else {}
        best = run_dir / "checkpoints" / "best.pt"
        return cls(
            run_dir=run_dir,
            metrics=last,
            epochs=int(last.get("epoch", 0)),
            stopped_early=bool(last.get("stopped_early", 0)),
            best_checkpoint=best if best.exists() else None,
        )


def make_optimizer(task: Task, cfg: SupervisedConfig, params: Any) -> torch.optim.Optimizer:
    if task.optimizer is not None:
        return task.optimizer(params)
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    kind = torch.optim.AdamW if cfg.optimizer == "adamw" else torch.optim.Adam
    return kind(params, lr=cfg.lr, weight_decay=cfg.weight_decay)


def make_scheduler(task: Task, cfg: SupervisedConfig, optimizer: torch.optim.Optimizer, total_steps: int) -> Any:
    """An LR scheduler stepped once per optimizer step (None: constant learning rate)."""
    if task.scheduler is not None:
        return task.scheduler(optimizer, total_steps)
    if cfg.scheduler == "cosine":
        return torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=max(1, total_steps))
    return None


def build_datasets(task: Task) -> dict[str, Any]:
    """The task's datasets by split, each checked to be a non-empty map-style dataset."""
    datasets = {}
    for split in ("train", "val", "test"):
        factory = getattr(task, split)
        if factory is None:
            continue
        dataset = factory()
        try:
            size = len(dataset)
        except TypeError:
            raise UsageError(
                f"the {split} dataset has no len(): the Trainer shards map-style datasets "
                f"(an IterableDataset cannot be split exactly over ranks)"
            ) from None
        if size == 0:
            raise UsageError(f"the {split} dataset is empty")
        datasets[split] = dataset
    if "train" not in datasets:
        raise UsageError("the task has no training data (Task.train is None)")
    return datasets


def monitored(cfg: SupervisedConfig, task: Task) -> str:
    """The metric deciding early stopping and best.pt; checked to be one the job measures."""
    if cfg.monitor == "auto":
        return "val/loss" if task.val is not None else "train/loss"
    split, _, name = cfg.monitor.partition("/")
    if split == "val" and task.val is None:
        raise UsageError(f"monitor={cfg.monitor} but the task has no validation set; monitor train/loss")
    known = ["loss", *task.metrics] if split == "val" else ["loss"]
    if name not in known:
        raise UsageError(f"monitor={cfg.monitor}: the job measures {', '.join(f'{split}/{k}' for k in known)}")
    return cfg.monitor


def average_buffers(rt: Runtime, module: torch.nn.Module) -> None:
    """Mean of floating buffers (BatchNorm statistics) over ranks: DDP leaves them per rank."""
    for buffer in module.buffers():
        if buffer.is_floating_point():
            with torch.no_grad():
                buffer.copy_(rt.all_reduce_mean(buffer))


def build_loaders(
    rt: Runtime, cfg: SupervisedConfig, task: Task, datasets: dict[str, Any]
) -> tuple[DataLoader, DataLoader | None]:
    """This rank's training batches and validation shard (None: no validation set). Collective:
    DistributedSampler gives every rank the same number of batches; a mismatch would leave one
    rank waiting in an all-reduce, so it is refused up front."""
    loader = train_loader(datasets["train"], cfg, rt.rank, rt.world_size, task.collate_fn)
    val_loader = (
        eval_loader(datasets["val"], cfg, rt.rank, rt.world_size, task.collate_fn) if "val" in datasets else None
    )
    lengths = rt.all_gather_object(len(loader))
    if len(set(lengths)) != 1:
        raise RuntimeError(f"ranks have different numbers of training batches: {lengths}")
    return loader, val_loader


def resume_position(rt: Runtime, run: Run) -> tuple[int, int, dict[str, float]]:
    """Where training goes on: the epochs done and, of an epoch a stop signal interrupted, the
    micro-batches done with their loss and sample sums (with another world size the shards do not
    line up with what was done: that epoch starts over)."""
    epoch = int(run.counters["epoch"]) if run.resumed else 0
    if run.resumed and run.counters.get("batches"):
        if run.same_world:
            return epoch, int(run.counters["batches"]), run.counters["partial"]
        log.warning(
            "epoch %d was interrupted on %d rank(s): it starts over on %d",
            epoch + 1,
            run.checkpoint["world_size"],
            rt.world_size,
        )
    return epoch, 0, {"loss": 0.0, "samples": 0.0}


def train(rt: Runtime, cfg: SupervisedConfig) -> FitResult:
    """``ddprl train algo=supervised``: the task named by ``cfg.task`` (a shipped one or module:function)."""
    from ddprl.supervised.tasks import load_task

    return fit(rt, cfg, load_task(cfg))


def fit(rt: Runtime, cfg: SupervisedConfig, task: Task) -> FitResult:
    """Train ``task`` on this rank (every rank calls it); the result is the same on every rank."""
    monitor = monitored(cfg, task)
    run = Run(
        rt, cfg, score_mode=cfg.mode, rate_key="time/samples_per_s", score_name=monitor, step_unit="optimizer steps"
    )
    datasets = build_datasets(task)
    net = rt.wrap(task.model(), compile=cfg.compile)  # rank 0's weights on every rank
    plain = rt.unwrap(net)
    loader, val_loader = build_loaders(rt, cfg, task, datasets)  # collective: as many batches on every rank
    micro_batches = len(loader)
    steps_per_epoch = math.ceil(micro_batches / cfg.sync_freq)
    total_steps = steps_per_epoch * cfg.epochs

    optimizer = make_optimizer(task, cfg, plain.parameters())
    scheduler = make_scheduler(task, cfg, optimizer, total_steps)
    scaler = torch.amp.GradScaler(rt.device.type, enabled=cfg.precision == "fp16")
    stopper = EarlyStopping(cfg.mode, cfg.patience, cfg.min_delta)
    # The checkpoint's shared state, by key: resumed and saved through this one table.
    parts = dict(model=plain, optimizer=optimizer, scheduler=scheduler, scaler=scaler, early_stopping=stopper)
    run.restore(parts)
    epoch, done_batches, carried = resume_position(rt, run)  # carried: sums of an interrupted epoch
    run.restore_rank_state()
    run.open(total_steps)
    autocast = autocast_context(rt.device, cfg.precision)
    effective_batch = cfg.effective_batch_size(rt.world_size)
    if rt.is_main:
        log.info(
            "%d samples to train on, %d rank(s) x batch_size %d x sync_freq %d = %d samples per "
            "optimizer step, %d steps per epoch",
            len(datasets["train"]),
            rt.world_size,
            cfg.batch_size,
            cfg.sync_freq,
            effective_batch,
            steps_per_epoch,
        )

    def save(step: int, counters: dict[str, Any], score: float | None = None) -> None:
        run.save(step, state=state_of(parts), counters=counters, score=score)

    step, row = run.step, {}
    while epoch < cfg.epochs and not stopper.stopped:
        start = time.perf_counter()
        start_epoch(loader, epoch, done_batches * cfg.batch_size)
        train_sums, step, done_batches = train_one_epoch(
            rt,
            cfg,
            task,
            net,
            plain,
            loader,
            optimizer,
            scheduler,
            scaler,
            autocast,
            run,
            step,
            micro_batches,
            done_batches,
        )
        train_sums = {k: float(train_sums[k]) + carried[k] for k in carried}
        if done_batches < micro_batches:  # a signal: save where the epoch is, leave together (exit 75)
            save(step, {"epoch": epoch, "batches": done_batches, "partial": train_sums})
            run.preempted(step)
        done_batches, carried = 0, {"loss": 0.0, "samples": 0.0}
        epoch += 1
        row = epoch_row(epoch, train_sums, optimizer, effective_batch, time.perf_counter() - start)
        average_buffers(rt, plain)
        validated = val_loader is not None and (epoch % cfg.eval_freq == 0 or epoch == cfg.epochs)
        if validated:
            with run.split.phase("eval"):
                row.update(evaluate(rt, plain, val_loader, task, "val", autocast))
        score = row.get(monitor) if validated or monitor.startswith("train/") else None
        improved, stop = decide(rt, cfg, run, stopper, score, epoch, monitor)  # collective: rank 0's decision
        last = stop or epoch == cfg.epochs
        if stop:
            row["stopped_early"] = 1.0
        if not last:
            # The row before its checkpoint: a job killed between the two resumes from the
            # previous checkpoint and writes the row again, never skips it.
            run.log(step, row)
        # Saved when improved (best.pt), due, last, or at a stop signal (also one that came during
        # validation). Improved is rank 0's decision: the score goes along only then, so that no
        # rank judges it alone.
        due = improved or bool(cfg.checkpoint_freq and epoch % cfg.checkpoint_freq == 0)
        save_now = functools.partial(save, step, {"epoch": epoch})
        run.step_boundary(step, save_now, score if improved else None, due, last)
        if last:  # the test metrics are of best.pt, saved just above
            if "test" in datasets:
                row.update(test_best(rt, cfg, run, task, plain, datasets["test"], autocast, monitor))
            run.log(step, row)
    run.finish()  # rank 0 prints the summary block (test metrics of best.pt included)
    best = run.dir / "checkpoints" / "best.pt" if run.best is not None else None
    return FitResult(run_dir=run.dir, metrics=row, epochs=epoch, stopped_early=stopper.stopped, best_checkpoint=best)


def epoch_row(
    epoch: int, sums: dict[str, float], optimizer: torch.optim.Optimizer, effective_batch: int, seconds: float
) -> dict[str, float]:
    """The row of a finished epoch: its global training loss, learning rate, samples and speed."""
    return {
        "epoch": epoch,
        "train/loss": sums["loss"] / sums["samples"],
        "train/lr": optimizer.param_groups[0]["lr"],
        "train/samples": sums["samples"],
        "train/effective_batch_size": effective_batch,
        "time/samples_per_s": sums["samples"] / seconds,
        "time/epoch_s": seconds,
    }


def decide(
    rt: Runtime,
    cfg: SupervisedConfig,
    run: Run,
    stopper: EarlyStopping,
    score: float | None,
    epoch: int,
    monitor: str,
) -> tuple[bool, bool]:
    """Collective: whether ``score`` (the ``monitor``ed metric after ``epoch``, None when not
    measured) improves on the best, and whether to stop early. Every rank sees the same global
    score; rank 0's decision is still the one taken (broadcast), so no float or state difference
    can ever split the ranks."""
    improved = score is not None and run.improves(score)
    if score is not None:
        stopper.update(score)
    stop, improved = rt.broadcast_object((stopper.stopped, improved))
    stopper.stopped = stop
    if stop and rt.is_main:
        log.info(
            "early stop after epoch %d: %s did not improve for %d validation(s) (best %.6g)",
            epoch,
            monitor,
            cfg.patience,
            stopper.best,
        )
    return improved, stop


def train_one_epoch(
    rt: Runtime,
    cfg: SupervisedConfig,
    task: Task,
    net: torch.nn.Module,
    plain: torch.nn.Module,
    loader: Any,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    scaler: torch.amp.GradScaler,
    autocast: contextlib.AbstractContextManager,
    run: Run,
    step: int,
    micro_batches: int,
    first: int = 0,
) -> tuple[dict[str, Any], int, int]:
    """One pass over this rank's shard from micro-batch ``first`` (of ``micro_batches``); returns the
    global loss sum and sample count of what it trained, the step, and the micro-batches done
    (fewer than ``micro_batches`` when a stop signal ended the pass after an optimizer step)."""
    net.train()
    loss_sum = torch.zeros((), dtype=torch.float64, device=rt.device)
    samples = 0
    done = micro_batches
    for i, batch in enumerate(timed(loader, run.split, "data"), start=first):
        group_start = i - i % cfg.sync_freq
        group_size = min(cfg.sync_freq, micro_batches - group_start)  # the epoch's last group may be short
        last_micro = i == group_start + group_size - 1
        with run.split.phase("learn"):
            inputs, target = task.split_batch(to_device(batch, rt.device, non_blocking=True))
            with rt.no_sync(net, enabled=not last_micro):  # all-reduce once, on the last micro-batch
                with autocast:
                    output = net(inputs)
                loss = task.loss(output.float() if output.is_floating_point() else output, target)
                scaler.scale(loss / group_size).backward()
            n = batch_len(target)
            loss_sum += loss.detach().double() * n
            samples += n
            if last_micro:
                if cfg.max_grad_norm > 0:
                    scaler.unscale_(optimizer)
                    torch.nn.utils.clip_grad_norm_(plain.parameters(), cfg.max_grad_norm)
                scaler.step(optimizer)
                scaler.update()
                optimizer.zero_grad(set_to_none=True)
                if scheduler is not None:
                    scheduler.step()
        if not last_micro:
            continue
        step += 1
        run.progress(step)
        if cfg.log_freq and step % cfg.log_freq == 0:
            run.log(step, {"train/step_loss": rt.all_reduce_mean(float(loss.detach()))})
        if i + 1 < micro_batches and run.stop_requested():  # collective: a SIGTERM/SIGUSR1 reached some rank
            done = i + 1
            break
    totals = rt.all_reduce_sum({"loss": loss_sum, "samples": float(samples)})
    return totals, step, done


def timed(loader: Any, split: TimeSplit, phase: str) -> Iterator[Any]:
    """``loader``'s items, the time spent waiting for each charged to ``phase``."""
    items = iter(loader)
    while True:
        with split.phase(phase):
            item = next(items, _END)
        if item is _END:
            return
        yield item


_END = object()


def test_best(
    rt: Runtime,
    cfg: SupervisedConfig,
    run: Run,
    task: Task,
    plain: torch.nn.Module,
    dataset: Any,
    autocast: contextlib.AbstractContextManager,
    monitor: str,
) -> dict[str, float]:
    """Test metrics of the best checkpoint (the last weights when nothing was validated)."""
    if run.best is not None:
        state = None
        if rt.is_main:  # rank 0 wrote it; the others may not share its file system
            state = torch.load(run.dir / "checkpoints" / "best.pt", map_location="cpu", weights_only=True)["state"][
                "model"
            ]
        plain.load_state_dict(rt.broadcast_object(state))
        if rt.is_main:
            log.info("testing best.pt (step %d, %s=%.6g)", run.best["step"], monitor, run.best["score"])
    loader = eval_loader(dataset, cfg, rt.rank, rt.world_size, task.collate_fn)
    return evaluate(rt, plain, loader, task, "test", autocast)
