"""Supervised training overhead: ddprl's Trainer vs a plain PyTorch DDP loop vs PyTorch Lightning.

Every row trains the same MLP on the same data with the same batches, 2 ranks on CPU over gloo
(spawned processes, one intra-op thread per rank), Adam, for the same number of epochs, in this
one process one after the other (the order rotates between repeats):

    pip install pytorch-lightning        # only for the Lightning rows (or pass --skip-lightning)
    python benchmarks/supervised_overhead.py [--epochs 8] [--samples 60000] [--repeats 3] [--skip-lightning]
        [--paired 10] [--report report.md]

Workload: scikit-learn's 8x8 digits, standardised, resampled with replacement to --samples
training and --val-samples validation samples with Gaussian noise (sigma 0.5) added, so an epoch
is long enough to time; an MLP 64 -> --hidden -> 10, cross-entropy, Adam(lr), --batch-size per
rank. Training batches: ``DistributedSampler(shuffle=True, seed=seed)``, ``set_epoch(e)`` every
epoch; validation: each rank a contiguous half of the validation set (every sample once).
Every rank seeds torch with ``seed + rank`` before building the model (ddprl's rule), so rank 0's
weights, which DDP broadcasts, are ``torch.manual_seed(seed)`` then the model; Lightning builds the
model in this process after ``torch.manual_seed(seed)``: the same initial weights everywhere.

Rows:
    plain                     torch.multiprocessing.spawn + DDP + ``loss.backward(); opt.step()``;
                              train loss summed on the rank and all-reduced once per epoch; validation
                              loss and accuracy summed per rank and all-reduced once (a 3-vector).
    ddprl default             ``ddprl.supervised.Trainer`` with its defaults: validation every epoch
                              (loss + accuracy), a checkpoint whenever val/loss improves, progress bar.
    ddprl val, no ckpt        validation every epoch, but ``monitor=train/loss mode=max`` so the
                              "improved" rule almost never fires: (nearly) no checkpoint in the epochs
                              measured (the "ckpts" column counts the ones written).
    ddprl minimal             ``eval_freq=epochs progress=false``: validation (and so the checkpoint)
                              only after the last epoch, outside the epochs measured.
    lightning default         ``pl.Trainer(accelerator="cpu", devices=2, strategy="ddp_spawn")`` with
                              its default extras: ModelCheckpoint (saves every epoch), TensorBoard
                              logger, progress bar, model summary. ``self.log(..., sync_dist=True)``
                              for train loss (on_epoch) and val loss / accuracy.
    lightning minimal         the same without checkpointing, logger, progress bar, model summary.
    Lightning gets the same samplers (``use_distributed_sampler=False``) and no sanity validation.

Times (all from rank 0, start-up, the first epoch and the last epoch excluded: medians over
epochs 2 .. epochs-1 of each run, then the median over repeats):
    train s/epoch   the training pass alone: from ``set_epoch`` to the last optimizer step and the
                    epoch's train-loss all-reduce (ddprl: its logged ``time/epoch_s``; Lightning: from
                    ``on_train_epoch_start`` to the last ``on_train_batch_end``, so its epoch-end
                    train-loss reduction falls in the cycle instead).
    epoch cycle s   everything an epoch costs: training, validation, checkpoint, logging, i.e. the
                    time from the start of epoch e to the start of epoch e+1 (ddprl: the difference
                    of consecutive rows' ``wall_time`` in metrics.jsonl, each row written at the end
                    of its epoch, after the checkpoint).
The final weights of every row are compared with the plain loop's (max absolute difference).

Separate runs on a small machine differ by more than a few percent (which cores the ranks and
gloo's threads land on, other processes): each run measures the CPU other processes used meanwhile
(/proc/stat minus this process tree) and is redone when that exceeds --max-other. For a precise
attribution, --paired runs ddprl's own pieces (``train_one_epoch``, ``evaluate``, ``Run.save``,
``Run.log``, the broadcast of the stop decision) and the plain code alternately, epoch after epoch,
inside the same 2 ddprl ranks (real Runtime and Run, one DDP model), and reports paired ratios.

The Lightning progress bar writes to stdout: --report FILE keeps the final tables apart.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import platform
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# One intra-op thread per rank for every row (ddprl and Lightning both pick 1 on 2 cores with 2
# ranks when this is unset; setting it makes it explicit and equal).
os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
from machine import cpu_counters, cpu_model, emit_report, foreign_load  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset  # noqa: E402

WORLD_SIZE = 2
_LIGHTNING_ENV = "SUPERVISED_OVERHEAD_LIGHTNING"  # set while Lightning runs: its spawned ranks define the classes


# -- the shared workload ------------------------------------------------------------------------


@functools.cache
def _digits() -> tuple[torch.Tensor, torch.Tensor]:
    from sklearn.datasets import load_digits

    data = load_digits()
    x = torch.as_tensor(data.data, dtype=torch.float32)
    x = (x - x.mean(0)) / x.std(0).clamp_min(1e-6)
    return x, torch.as_tensor(data.target, dtype=torch.long)


def digits_like(n: int, seed: int) -> TensorDataset:
    """``n`` noisy resampled digits (own generator: the global torch RNG is not touched)."""
    x, y = _digits()
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, len(x), (n,), generator=g)
    return TensorDataset(x[idx] + 0.5 * torch.randn(n, x.shape[1], generator=g), y[idx])


def make_model(hidden: tuple[int, ...]) -> nn.Sequential:
    """Linear layers with ReLU between them (built like ``ddprl.supervised.tasks.mlp``)."""
    layers: list[nn.Module] = []
    width = 64
    for h in hidden:
        layers += [nn.Linear(width, h), nn.ReLU()]
        width = h
    layers.append(nn.Linear(width, 10))
    return nn.Sequential(*layers)


def val_shard(n: int, rank: int, world: int) -> range:
    """Rank ``rank``'s contiguous part of ``n`` validation samples (every sample once over ranks)."""
    return range(rank * n // world, (rank + 1) * n // world)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- plain PyTorch DDP --------------------------------------------------------------------------


def plain_rank(rank: int, world: int, port: int, args: argparse.Namespace, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    torch.manual_seed(args.seed + rank)
    train_set, val_set = digits_like(args.samples, 1), digits_like(args.val_samples, 2)
    model = make_model(tuple(args.hidden))
    net = DDP(model)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    sampler = DistributedSampler(train_set, num_replicas=world, rank=rank, shuffle=True, seed=args.seed)
    loader = DataLoader(train_set, batch_size=args.batch_size, sampler=sampler)
    val_loader = DataLoader(val_set, batch_size=args.batch_size, sampler=val_shard(len(val_set), rank, world))
    loss_fn = nn.CrossEntropyLoss()
    epochs = []
    for epoch in range(args.epochs):
        start = time.perf_counter()
        sampler.set_epoch(epoch)
        net.train()
        train_sums = torch.zeros(2, dtype=torch.float64)
        for x, y in loader:
            loss = loss_fn(net(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            train_sums[0] += loss.detach().double() * len(y)
            train_sums[1] += len(y)
        dist.all_reduce(train_sums)
        trained = time.perf_counter()
        model.eval()
        val_sums = torch.zeros(3, dtype=torch.float64)
        with torch.no_grad():
            for x, y in val_loader:
                output = model(x)
                val_sums[0] += loss_fn(output, y).double() * len(y)
                val_sums[1] += (output.argmax(1) == y).sum()
                val_sums[2] += len(y)
        dist.all_reduce(val_sums)
        epochs.append(
            {
                "start": start,
                "train_s": trained - start,
                "val_s": time.perf_counter() - trained,
                "train/loss": float(train_sums[0] / train_sums[1]),
                "val/loss": float(val_sums[0] / val_sums[2]),
                "val/accuracy": float(val_sums[1] / val_sums[2]),
            }
        )
    if rank == 0:
        torch.save(model.state_dict(), Path(out) / "weights.pt")
        (Path(out) / "epochs.json").write_text(json.dumps(epochs))
    dist.barrier()
    # Leave without interpreter finalisation: with a DDP model alive, torch 2.13's gloo threads
    # can abort a finishing process (SIGABRT); ddprl's launch.exit_process does the same.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def run_plain(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as out:
        mp.spawn(plain_rank, args=(WORLD_SIZE, free_port(), args, out), nprocs=WORLD_SIZE, join=True)
        epochs = json.loads((Path(out) / "epochs.json").read_text())
        weights = torch.load(Path(out) / "weights.pt", weights_only=True)
    starts = [e["start"] for e in epochs]
    return {
        "train": [e["train_s"] for e in epochs],
        "cycle": [b - a for a, b in zip(starts, starts[1:], strict=False)],
        "weights": weights,
        "val_s": [e["val_s"] for e in epochs],
        "ckpts": 0,
        "final": epochs[-1],
    }


# -- ddprl --------------------------------------------------------------------------------------

DDPRL_VARIANTS = {
    "ddprl default": {},
    "ddprl val, no ckpt": {"monitor": "train/loss", "mode": "max"},
    "ddprl minimal": {"eval_freq": None, "progress": False},  # eval_freq: filled with epochs
}


def run_ddprl(args: argparse.Namespace, variant: str) -> dict[str, Any]:
    from ddprl.metrics import read_metrics
    from ddprl.supervised import Trainer

    keys = dict(DDPRL_VARIANTS[variant])
    if "eval_freq" in keys:
        keys["eval_freq"] = args.epochs
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        Trainer(
            model=functools.partial(make_model, tuple(args.hidden)),
            loss=nn.CrossEntropyLoss(),
            train=functools.partial(digits_like, args.samples, 1),
            val=functools.partial(digits_like, args.val_samples, 2),
            metrics=["accuracy"],
            optimizer=functools.partial(torch.optim.Adam, lr=args.lr),
            world_size=WORLD_SIZE,
            device="cpu",
            backend="gloo",
            epochs=args.epochs,
            batch_size=args.batch_size,
            seed=args.seed,
            run_dir=str(run_dir),
            **keys,
        ).fit()
        rows = [r for r in read_metrics(run_dir) if "epoch" in r]
        ckpt = torch.load(run_dir / "checkpoints" / "latest.pt", map_location="cpu", weights_only=True)
    walls = [r["wall_time"] for r in rows]
    # Checkpoints written after epochs 2 .. epochs-1 (the epochs whose cycle is measured): the loop
    # saves when the monitored value improves (strictly, like Run.improves).
    monitor, mode = keys.get("monitor", "val/loss"), keys.get("mode", "min")
    best, saves = None, 0
    for row in rows:
        score = row.get(monitor)
        if score is None:
            continue
        improved = best is None or (score > best if mode == "max" else score < best)
        if improved:
            best = score
            saves += 1 < row["epoch"] < args.epochs
    # Row e's wall_time is taken when row e is written (end of epoch e); the interval from row e-1
    # to row e is epoch e's cycle. The last row also holds the final save and test: left out.
    return {
        "train": [r["time/epoch_s"] for r in rows],
        "cycle": [None] + [b - a for a, b in zip(walls, walls[1:], strict=False)][:-1],
        "weights": ckpt["state"]["model"],
        "ckpts": saves,
        "final": rows[-1],
    }


# -- PyTorch Lightning --------------------------------------------------------------------------


def define_lightning() -> None:
    """Define ``LitMLP`` and ``EpochTimer`` in this module (imports pytorch_lightning).

    Called by ``main`` before Lightning runs and, through the environment variable, at import in
    Lightning's spawned ranks, which unpickle these classes from this module.
    """
    import pytorch_lightning as pl
    import torch.nn.functional as F

    class LitMLP(pl.LightningModule):
        def __init__(self, model: nn.Module, args: argparse.Namespace):
            super().__init__()
            self.model, self.args = model, args

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = F.cross_entropy(self.model(x), y)
            self.log("train/loss", loss, on_step=False, on_epoch=True, sync_dist=True, batch_size=len(y))
            return loss

        def validation_step(self, batch, batch_idx):
            x, y = batch
            output = self.model(x)
            self.log("val/loss", F.cross_entropy(output, y), sync_dist=True, batch_size=len(y))
            self.log("val/accuracy", (output.argmax(1) == y).float().mean(), sync_dist=True, batch_size=len(y))

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=self.args.lr)

        def train_dataloader(self):
            data = digits_like(self.args.samples, 1)
            sampler = DistributedSampler(
                data,
                num_replicas=self.trainer.world_size,
                rank=self.trainer.global_rank,
                shuffle=True,
                seed=self.args.seed,
            )
            return DataLoader(data, batch_size=self.args.batch_size, sampler=sampler)

        def val_dataloader(self):
            data = digits_like(self.args.val_samples, 2)
            shard = val_shard(len(data), self.trainer.global_rank, self.trainer.world_size)
            return DataLoader(data, batch_size=self.args.batch_size, sampler=shard)

    class EpochTimer(pl.Callback):
        """Rank 0's epoch start and last batch-end times, written to ``path`` at the end."""

        def __init__(self, path: str):
            self.path, self.starts, self.train_ends, self._last = path, [], [], 0.0

        def on_train_epoch_start(self, trainer, pl_module):
            self.starts.append(time.perf_counter())

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            self._last = time.perf_counter()

        def on_validation_epoch_start(self, trainer, pl_module):
            if trainer.training:  # validation inside fit: training of this epoch is over
                self.train_ends.append(self._last)

        def on_train_epoch_end(self, trainer, pl_module):
            if len(self.train_ends) < len(self.starts):  # an epoch without validation
                self.train_ends.append(self._last)

        def on_train_end(self, trainer, pl_module):
            if trainer.global_rank == 0:
                Path(self.path).write_text(json.dumps({"starts": self.starts, "train_ends": self.train_ends}))

    for cls in (LitMLP, EpochTimer):
        cls.__module__, cls.__qualname__ = __name__, cls.__name__
        globals()[cls.__name__] = cls


if os.environ.get(_LIGHTNING_ENV) == "1" and __name__ != "__main__":
    define_lightning()  # a spawned Lightning rank (this module imported as __mp_main__)


def run_lightning(args: argparse.Namespace, minimal: bool) -> dict[str, Any]:
    import warnings

    import pytorch_lightning as pl

    extras = (
        dict(enable_checkpointing=False, logger=False, enable_progress_bar=False, enable_model_summary=False)
        if minimal
        else {}
    )
    os.environ[_LIGHTNING_ENV] = "1"  # only Lightning's ranks import Lightning
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*(num_workers|does not have many workers|sync_dist).*")
        timer = EpochTimer(str(Path(tmp) / "epochs.json"))  # noqa: F821 (defined by define_lightning)
        torch.manual_seed(args.seed)
        lit = LitMLP(make_model(tuple(args.hidden)), args)  # noqa: F821
        trainer = pl.Trainer(
            accelerator="cpu",
            devices=WORLD_SIZE,
            strategy="ddp_spawn",
            max_epochs=args.epochs,
            num_sanity_val_steps=0,
            use_distributed_sampler=False,
            default_root_dir=tmp,
            callbacks=[timer],
            **extras,
        )
        try:
            trainer.fit(lit)  # the spawn launcher loads rank 0's final weights back into ``lit``
        finally:
            os.environ.pop(_LIGHTNING_ENV, None)
        times = json.loads((Path(tmp) / "epochs.json").read_text())
        final = {k: float(v) for k, v in trainer.callback_metrics.items()}
    starts, ends = times["starts"], times["train_ends"]
    return {
        "train": [e - s for s, e in zip(starts, ends, strict=False)],
        "cycle": [b - a for a, b in zip(starts, starts[1:], strict=False)],
        "weights": {k: v.detach().clone() for k, v in lit.model.state_dict().items()},
        "ckpts": None,
        "final": final,
    }


# -- paired, in-process: where ddprl's time goes ---------------------------------------------------


def paired_rank(rt: Any, cfg: Any, args: argparse.Namespace, out: str) -> None:
    """In the same 2 ddprl ranks (real Runtime, DDP, Run): the plain epoch and ddprl's pieces, alternating.

    Separate runs differ by more than the overhead sought (placement, other processes); here both
    arms share the processes, the model, the loader and the moment, epoch after epoch.
    """
    from ddprl.checkpoint import strip_prefixes
    from ddprl.run import Run
    from ddprl.supervised.data import eval_loader, train_loader
    from ddprl.supervised.loop import average_buffers, train_one_epoch
    from ddprl.supervised.metrics import accuracy, evaluate
    from ddprl.supervised.task import Task

    run = Run(rt, cfg, score_mode="min", rate_key="time/samples_per_s")  # seeds torch with seed + rank
    train_set, val_set = digits_like(args.samples, 1), digits_like(args.val_samples, 2)
    model = make_model(tuple(args.hidden))
    net = rt.wrap(model)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    loader = train_loader(train_set, cfg, rt.rank, rt.world_size)
    val_loader = eval_loader(val_set, cfg, rt.rank, rt.world_size)
    task = Task(model=None, loss=nn.CrossEntropyLoss(), metrics={"accuracy": accuracy})
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    run.open(2 * args.paired * len(loader))
    loss_fn = nn.CrossEntropyLoss()

    def plain_train() -> None:
        net.train()
        sums = torch.zeros(2, dtype=torch.float64)
        for x, y in loader:
            loss = loss_fn(net(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sums[0] += loss.detach().double() * len(y)
            sums[1] += len(y)
        dist.all_reduce(sums)

    def plain_val() -> None:
        model.eval()
        sums = torch.zeros(3, dtype=torch.float64)
        with torch.no_grad():
            for x, y in val_loader:
                output = model(x)
                sums[0] += loss_fn(output, y).double() * len(y)
                sums[1] += (output.argmax(1) == y).sum()
                sums[2] += len(y)
        dist.all_reduce(sums)
        model.train()

    step = 0
    times: dict[str, list[float]] = {
        k: []
        for k in (
            "plain train",
            "ddprl train_one_epoch",
            "plain validation",
            "ddprl evaluate",
            "ddprl average_buffers + broadcast_object",
            "ddprl run.save (checkpoint)",
            "ddprl run.log (row)",
        )
    }

    def timed(name: str, fn: Any) -> Any:
        start = time.perf_counter()
        result = fn()
        times[name].append(time.perf_counter() - start)
        return result

    for epoch in range(args.paired):
        arms = [("plain train", plain_train), ("ddprl train_one_epoch", None)]
        for name, fn in arms if epoch % 2 == 0 else arms[::-1]:
            loader.sampler.set_epoch(epoch)
            if fn is None:
                step = timed(
                    name,
                    lambda: train_one_epoch(
                        rt,
                        cfg,
                        task,
                        net,
                        model,
                        loader,
                        opt,
                        None,
                        scaler,
                        contextlib.nullcontext(),
                        run,
                        step,
                        len(loader),
                    ),
                )[1]
            else:
                timed(name, fn)
        vals = [
            ("plain validation", plain_val),
            ("ddprl evaluate", lambda: evaluate(rt, model, val_loader, task, "val", contextlib.nullcontext())),
        ]
        for name, fn in vals if epoch % 2 == 0 else vals[::-1]:
            timed(name, fn)
        timed(
            "ddprl average_buffers + broadcast_object",
            lambda: (average_buffers(rt, model), rt.broadcast_object((False, True))),
        )
        timed(
            "ddprl run.save (checkpoint)",
            lambda: run.save(
                step,
                state={
                    "model": strip_prefixes(model.state_dict()),
                    "optimizer": opt.state_dict(),
                    "scheduler": None,
                    "scaler": scaler.state_dict(),
                    "early_stopping": {"best": 1.0, "bad_evals": 0, "stopped": False},
                },
                counters={"epoch": epoch + 1},
                score=-float(epoch),
            ),
        )
        timed(
            "ddprl run.log (row)",
            lambda: run.log(
                step,
                {
                    "epoch": epoch + 1,
                    "train/loss": 0.1,
                    "train/lr": 1e-3,
                    "train/samples": 6e4,
                    "time/epoch_s": 1.0,
                    "time/samples_per_s": 6e4,
                    "val/loss": 0.1,
                    "val/accuracy": 0.9,
                    "val/num_samples": 1e4,
                },
            ),
        )
    run.close()
    if rt.is_main:
        (Path(out) / "paired.json").write_text(json.dumps({"times": times, "steps": len(loader)}))


def run_paired(args: argparse.Namespace) -> dict[str, Any]:
    from ddprl.runtime import launch
    from ddprl.supervised import Trainer

    with tempfile.TemporaryDirectory() as tmp:
        cfg = Trainer(
            model=None,
            loss=nn.CrossEntropyLoss(),
            train=[0],
            world_size=WORLD_SIZE,
            device="cpu",
            backend="gloo",
            batch_size=args.batch_size,
            seed=args.seed,
            run_dir=str(Path(tmp) / "run"),
            progress=not args.paired_no_progress,
        ).config()
        launch(functools.partial(paired_rank, args=args, out=tmp), cfg)
        return json.loads((Path(tmp) / "paired.json").read_text())


def print_paired(paired: dict[str, Any], args: argparse.Namespace) -> None:
    times, steps = paired["times"], paired["steps"]
    print(
        f"\n### Paired, in-process: the same 2 ddprl ranks alternate the plain code and ddprl's, "
        f"{args.paired} epochs each (first dropped)\n"
    )
    print(
        f"progress bar {'off' if args.paired_no_progress else 'on (ddprl default)'}; "
        f"{steps} steps per epoch per rank. Ratio: median over epochs of ddprl / plain in the same epoch.\n"
    )
    print("| piece | median s/epoch | per step | ddprl / plain (paired median, min-max) |")
    print("|---|---|---|---|")

    def row(name: str, base: str | None) -> None:
        values = times[name][1:]
        ratio = ""
        if base is not None:
            ratios = [a / b for a, b in zip(values, times[base][1:], strict=False)]
            ratio = f"{statistics.median(ratios) - 1:+.1%} ({min(ratios) - 1:+.1%} .. {max(ratios) - 1:+.1%})"
        per_step = f"{1e3 * statistics.median(values) / steps:.3f} ms" if "train" in name else ""
        print(f"| {name} | {statistics.median(values):.4f} | {per_step} | {ratio} |")

    row("plain train", None)
    row("ddprl train_one_epoch", "plain train")
    row("plain validation", None)
    row("ddprl evaluate", "plain validation")
    for name in ("ddprl average_buffers + broadcast_object", "ddprl run.save (checkpoint)", "ddprl run.log (row)"):
        row(name, None)


# -- the report ---------------------------------------------------------------------------------


def steady(values: list[float | None], epochs: int) -> list[float]:
    """Epochs 2 .. epochs-1 (indices 1 .. epochs-2): no first-epoch warm-up, no final save/test."""
    return [v for i, v in enumerate(values) if 1 <= i <= epochs - 2 and v is not None]


def max_abs_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    if a.keys() != b.keys():
        raise ValueError(f"different parameter names: {sorted(a)} vs {sorted(b)}")
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in a)


def machine() -> str:
    model = cpu_model()
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    versions = f"torch {torch.__version__}"
    try:
        import pytorch_lightning as pl

        versions += f", pytorch-lightning {pl.__version__}"
    except ImportError:
        pass
    return (
        f"{model}, {os.cpu_count()} logical cores ({usable} usable), Python {platform.python_version()}, "
        f"{versions}, OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']}"
    )


def fmt_range(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} ({min(values):.3f}-{max(values):.3f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=8, help="epochs per run (>= 3; epochs 2..E-1 are timed)")
    parser.add_argument("--samples", type=int, default=60_000, help="training samples")
    parser.add_argument("--val-samples", type=int, default=10_000, help="validation samples")
    parser.add_argument("--batch-size", type=int, default=64, help="samples per batch on each rank")
    parser.add_argument("--hidden", type=int, nargs="+", default=[256, 256], help="hidden layer widths")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--repeats", type=int, default=3, help="runs of every row (the order rotates); 0: only the paired comparison"
    )
    parser.add_argument("--skip-lightning", action="store_true", help="no Lightning rows (not installed)")
    parser.add_argument(
        "--paired",
        type=int,
        default=10,
        metavar="EPOCHS",
        help="epochs of the paired in-process comparison (0: skip it)",
    )
    parser.add_argument("--paired-no-progress", action="store_true", help="paired comparison with progress=false")
    parser.add_argument(
        "--max-other",
        type=float,
        default=0.2,
        metavar="CORES",
        help="a run during which other processes used more CPU than this is redone",
    )
    parser.add_argument("--retries", type=int, default=2, help="redos of a contended run (the least contended is kept)")
    parser.add_argument("--report", metavar="FILE", help="also write the final report (markdown) to FILE")
    parser.add_argument("--per-epoch", action="store_true", help="also print every run's per-epoch times")
    args = parser.parse_args()
    if args.repeats == 0 and not args.paired:
        parser.error("--repeats 0 needs --paired EPOCHS > 0")
    if args.epochs < 3:
        parser.error("--epochs must be >= 3 (the first and the last epoch are not timed)")

    runners = {"plain": run_plain}
    runners.update({name: functools.partial(run_ddprl, variant=name) for name in DDPRL_VARIANTS})
    if not args.skip_lightning:
        try:
            import pytorch_lightning  # noqa: F401
        except ImportError:
            parser.error("pytorch_lightning is not installed: pip install pytorch-lightning, or pass --skip-lightning")
        define_lightning()
        runners["lightning default"] = functools.partial(run_lightning, minimal=False)
        runners["lightning minimal"] = functools.partial(run_lightning, minimal=True)

    names = list(runners)
    results: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    for repeat in range(args.repeats):
        order = names[repeat % len(names) :] + names[: repeat % len(names)]
        for name in order:
            kept: dict[str, Any] = {}
            for attempt in range(args.retries + 1):  # a run other processes shared the cores with is redone
                began = cpu_counters()
                result = runners[name](args)
                other = foreign_load(began, cpu_counters())
                result["other"] = other
                if attempt == 0 or other < kept["other"]:
                    kept = result
                if other <= args.max_other:
                    break
                print(
                    f"[repeat {repeat + 1}/{args.repeats}] {name}: other processes used {other:.2f} cores "
                    f"(> {args.max_other}), attempt {attempt + 1} of {args.retries + 1}",
                    flush=True,
                )
            result = kept
            results[name].append(result)
            train, cycle = steady(result["train"], args.epochs), steady(result["cycle"], args.epochs)
            print(
                f"[repeat {repeat + 1}/{args.repeats}] {name:20s} train {statistics.median(train):.3f} s/epoch, "
                f"cycle {statistics.median(cycle):.3f} s/epoch, {time.perf_counter() - began[3]:.1f} s with start-up, "
                f"other processes {result['other']:.2f} cores",
                flush=True,
            )
            if args.per_epoch:
                print("    train:", " ".join(f"{v:.3f}" for v in result["train"]))
                print("    cycle:", " ".join("-" if v is None else f"{v:.3f}" for v in result["cycle"]))

    paired = None
    if args.paired:
        began = cpu_counters()
        paired = run_paired(args)
        other = foreign_load(began, cpu_counters())
        print(f"[paired] {args.paired} epochs per arm, other processes {other:.2f} cores", flush=True)

    emit_report(lambda: print_report(args, names, results, paired), args.report)


def print_report(
    args: argparse.Namespace, names: list[str], results: dict[str, list[dict[str, Any]]], paired: dict[str, Any] | None
) -> None:
    if args.repeats == 0:  # the paired comparison alone
        print(f"\nMachine: {machine()}")
        print_paired(paired, args)
        return
    plain_weights = results["plain"][0]["weights"]
    steps = -(-args.samples // (WORLD_SIZE * args.batch_size))

    def medians(name: str, key: str) -> list[float]:
        return [statistics.median(steady(r[key], args.epochs)) for r in results[name]]

    def clean(name: str) -> list[bool]:
        return [r["other"] <= args.max_other for r in results[name]]

    def vs_plain(name: str, key: str) -> tuple[str, bool]:
        """Median over repeats of row / plain within the same repeat (both runs clean where any are)."""
        pairs = list(zip(medians(name, key), medians("plain", key), clean(name), clean("plain"), strict=False))
        kept = [(a, b) for a, b, ok_a, ok_b in pairs if ok_a and ok_b] or [(a, b) for a, b, _, _ in pairs]
        ratios = [a / b - 1 for a, b in kept]
        text = f"{statistics.median(ratios):+.1%}"
        if len(ratios) > 1:
            text += f" ({min(ratios):+.1%} .. {max(ratios):+.1%})"
        return text, len(kept) < len(pairs) or not all(clean(name))

    print("\n### Supervised epoch time: ddprl Trainer vs plain DDP vs Lightning\n")
    print(f"Machine: {machine()}  ")
    print(
        f"Workload: {args.samples:,} train / {args.val_samples:,} val samples (digits, resampled + noise), "
        f"MLP 64-{'-'.join(map(str, args.hidden))}-10, Adam lr={args.lr}, batch {args.batch_size} per rank x "
        f"{WORLD_SIZE} ranks (gloo, CPU), {steps} steps/epoch per rank, {args.epochs} epochs, "
        f"{args.repeats} repeat(s); epochs 2-{args.epochs - 1} timed.  "
    )
    contended = sum(not ok for name in names for ok in clean(name))
    if contended:
        print(
            f"**Warning**: {contended} kept run(s) shared the cores with other processes (> {args.max_other} "
            f"cores, see the per-run lines): left out of the ratios where the same repeat has clean runs; "
            f"rows marked * include them.  "
        )
    print(
        "Times: median over timed epochs of each run, then median (min-max) over repeats. "
        "train = training pass only; cycle = start of epoch to start of next (train + val + ckpt + logging). "
        "vs plain: median over repeats of row / plain in the same repeat (min .. max).\n"
    )
    print(
        "| row | train s/epoch | train vs plain | cycle s/epoch | cycle vs plain | samples/s (train) "
        "| ckpts in timed epochs | max abs weight diff vs plain |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for name in names:
        runs = results[name]
        train, cycle = medians(name, "train"), medians(name, "cycle")
        diffs = [max_abs_diff(plain_weights, r["weights"]) for r in runs]
        ckpts = "-" if runs[0]["ckpts"] is None else "/".join(str(r["ckpts"]) for r in runs)
        if name.startswith("lightning"):
            ckpts = "every epoch" if name == "lightning default" else "0"
        (train_ratio, dirty_t), (cycle_ratio, dirty_c) = vs_plain(name, "train"), vs_plain(name, "cycle")
        mark = "*" if dirty_t or dirty_c else ""
        print(
            f"| {name}{mark} | {fmt_range(train)} | {train_ratio} | {fmt_range(cycle)} | {cycle_ratio} "
            f"| {args.samples / statistics.median(train):,.0f} | {ckpts} | {max(diffs):.3g} |"
        )
    if args.paired:
        print_paired(paired, args)
    print("\nFinal metrics (first repeat):")
    for name in names:
        final = results[name][0]["final"]
        shown = {k: final[k] for k in ("train/loss", "val/loss", "val/accuracy") if k in final}
        print(f"  {name:20s} " + " ".join(f"{k}={v:.5f}" for k, v in shown.items()))


if __name__ == "__main__":
    main()
