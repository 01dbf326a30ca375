"""Supervised epoch time: ddprl's Trainer against a plain PyTorch DDP loop and PyTorch Lightning, the same MLP, data
(noisy resampled digits), batches, seed and initial weights, 2 gloo ranks of one thread; epochs 2..E-1 of each run
timed (median), the median over --repeats rotated. train: the training pass; cycle: an epoch's start to the next's
(validation, checkpoint, logging). --paired: the same 2 ranks alternate the plain code and ddprl's pieces.

    pip install pytorch-lightning      # or --skip-lightning
    python benchmarks/supervised_overhead.py [--repeats 3] [--paired 10] [--epochs 8] [--samples 60000]
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import harness as h
import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

LIGHTNING, LOSS = "SUPERVISED_OVERHEAD_LIGHTNING", nn.CrossEntropyLoss()  # set while Lightning runs (its ranks)
VARIANTS = {  # eval_freq None: the last epoch only, outside the epochs timed
    "ddprl default": {},
    "ddprl val, no ckpt": {"monitor": "train/loss", "mode": "max"},  # "improved" (nearly) never: no checkpoint
    "ddprl minimal": {"eval_freq": None, "progress": False},
}
PIECES = ("plain train", "ddprl train_one_epoch", "plain validation", "ddprl evaluate")
PIECES += ("ddprl average_buffers + broadcast_object", "ddprl run.save (checkpoint)", "ddprl run.log (row)")


def digits_like(n: int, seed: int) -> TensorDataset:
    """``n`` resampled standardised digits with Gaussian noise (sigma 0.5), from their own generator."""
    from sklearn.datasets import load_digits

    (x, y), g = load_digits(return_X_y=True), torch.Generator().manual_seed(seed)
    x, y = torch.as_tensor(x, dtype=torch.float32), torch.as_tensor(y)
    x, idx = (x - x.mean(0)) / x.std(0).clamp_min(1e-6), torch.randint(0, len(x), (n,), generator=g)
    return TensorDataset(x[idx] + 0.5 * torch.randn(n, x.shape[1], generator=g), y[idx])


def make_model(hidden: tuple[int, ...]) -> nn.Sequential:
    sizes = [64, *hidden, 10]
    return nn.Sequential(
        *[m for a, b in zip(sizes, sizes[1:], strict=False) for m in (nn.Linear(a, b), nn.ReLU())][:-1]
    )


def loaders(args, rank: int, world: int) -> tuple[DataLoader, DataLoader]:
    """DistributedSampler(shuffle, seed) batches; each rank a contiguous part of the validation set."""
    train, val = digits_like(args.samples, 1), digits_like(args.val_samples, 2)
    sampler = DistributedSampler(train, num_replicas=world, rank=rank, shuffle=True, seed=args.seed)
    shard = range(rank * len(val) // world, (rank + 1) * len(val) // world)
    return DataLoader(train, args.batch_size, sampler=sampler), DataLoader(val, args.batch_size, sampler=shard)


def plain_epoch(net, loader, opt) -> None:
    net.train()
    sums = torch.zeros(2, dtype=torch.float64)
    for x, y in loader:
        loss = LOSS(net(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sums[0] += loss.detach().double() * len(y)
        sums[1] += len(y)
    dist.all_reduce(sums)


def plain_validate(model, loader) -> None:
    model.eval()
    sums = torch.zeros(3, dtype=torch.float64)
    with torch.no_grad():
        for x, y in loader:
            out = model(x)
            sums[0] += LOSS(out, y).double() * len(y)
            sums[1] += (out.argmax(1) == y).sum()
            sums[2] += len(y)
    dist.all_reduce(sums)
    model.train()


def plain_rank(rt, cfg, args, out: str) -> None:
    """torch's DDP and the loop above in ddprl's 2 ranks; rank 0's weights are ``torch.manual_seed(seed)``'s."""
    torch.manual_seed(args.seed + rt.rank)
    model, (loader, val_loader) = make_model(tuple(args.hidden)), loaders(args, rt.rank, rt.world_size)
    net, opt = nn.parallel.DistributedDataParallel(model), torch.optim.Adam(model.parameters(), lr=args.lr)
    starts, train_s = [], []
    for epoch in range(args.epochs):
        starts.append(time.perf_counter())
        loader.sampler.set_epoch(epoch)
        plain_epoch(net, loader, opt)
        train_s.append(time.perf_counter() - starts[-1])
        plain_validate(model, val_loader)
    if rt.is_main:
        torch.save(model.state_dict(), Path(out) / "weights.pt")
        cycle = [b - a for a, b in zip(starts, starts[1:], strict=False)]
        (Path(out) / "result.json").write_text(json.dumps({"train": train_s, "cycle": cycle, "ckpts": 0}))


def paired_rank(rt, cfg, args, out: str) -> None:
    """In the same 2 ddprl ranks (Runtime, DDP, Run): the plain epoch and ddprl's pieces, alternating epoch by epoch."""
    from ddprl.checkpoint import strip_prefixes
    from ddprl.run import Run
    from ddprl.supervised.data import eval_loader, train_loader
    from ddprl.supervised.loop import average_buffers, train_one_epoch
    from ddprl.supervised.metrics import accuracy, evaluate
    from ddprl.supervised.task import Task

    run = Run(rt, cfg, score_mode="min", rate_key="time/samples_per_s")  # seeds torch with seed + rank
    model, task = make_model(tuple(args.hidden)), Task(model=None, loss=LOSS, metrics={"accuracy": accuracy})
    net, opt = rt.wrap(model), torch.optim.Adam(model.parameters(), lr=args.lr)
    loader = train_loader(digits_like(args.samples, 1), cfg, rt.rank, rt.world_size)
    val_loader = eval_loader(digits_like(args.val_samples, 2), cfg, rt.rank, rt.world_size)
    scaler, times, step = torch.amp.GradScaler("cpu", enabled=False), {k: [] for k in PIECES}, 0
    run.open(2 * args.paired * len(loader))
    stopping = {"best": 1.0, "bad_evals": 0, "stopped": False}
    state = lambda: dict(model=strip_prefixes(model.state_dict()), optimizer=opt.state_dict(), scheduler=None)  # noqa: E731
    row = {"train/loss": 0.1, "train/lr": 1e-3, "train/samples": 6e4, "time/epoch_s": 1.0, "time/samples_per_s": 6e4}
    row |= {"val/loss": 0.1, "val/accuracy": 0.9, "val/num_samples": 1e4}

    def ddprl_epoch():
        nonlocal step
        pieces = (rt, cfg, task, net, model, loader, opt, None, scaler, contextlib.nullcontext(), run, step)
        step = train_one_epoch(*pieces, len(loader))[1]

    def save():
        saved = {**state(), "scaler": scaler.state_dict(), "early_stopping": stopping}
        return run.save(step, saved, counters={"epoch": epoch + 1}, score=-float(epoch))

    arms = {PIECES[0]: lambda: plain_epoch(net, loader, opt), PIECES[1]: ddprl_epoch}
    arms |= {PIECES[2]: lambda: plain_validate(model, val_loader)}
    arms |= {PIECES[3]: lambda: evaluate(rt, model, val_loader, task, "val", contextlib.nullcontext())}
    arms |= {PIECES[4]: lambda: (average_buffers(rt, model), rt.broadcast_object((False, True)))}
    arms |= {PIECES[5]: save, PIECES[6]: lambda: run.log(step, {"epoch": epoch + 1, **row})}
    for epoch in range(args.paired):
        flip = slice(None, None, -1 if epoch % 2 else 1)  # the order of each pair alternates
        for name in [*PIECES[0:2][flip], *PIECES[2:4][flip], *PIECES[4:]]:
            loader.sampler.set_epoch(epoch)
            start = time.perf_counter()
            arms[name]()
            times[name].append(time.perf_counter() - start)
    run.close()
    if rt.is_main:
        (Path(out) / "result.json").write_text(json.dumps({"times": times, "steps": len(loader)}))


def in_ranks(rank_fn, args) -> dict:
    """``rank_fn(rt, cfg, args, out)`` on 2 gloo ranks started by ddprl; what rank 0 wrote (and its weights)."""
    from ddprl.runtime import launch
    from ddprl.supervised import Trainer

    with tempfile.TemporaryDirectory() as tmp:
        keys = dict(world_size=2, device="cpu", backend="gloo", batch_size=args.batch_size, seed=args.seed)
        cfg = Trainer(None, LOSS, [0], run_dir=f"{tmp}/run", **keys).config()
        launch(functools.partial(rank_fn, args=args, out=tmp), cfg)
        result = json.loads((Path(tmp) / "result.json").read_text())
        weights = Path(tmp) / "weights.pt"
        return {**result, "weights": torch.load(weights, weights_only=True)} if weights.exists() else result


def run_ddprl(args, variant: str) -> dict:
    from ddprl.metrics import read_metrics
    from ddprl.supervised import Trainer

    keys = {k: args.epochs if v is None else v for k, v in VARIANTS[variant].items()}
    with tempfile.TemporaryDirectory() as tmp:
        keys |= dict(epochs=args.epochs, batch_size=args.batch_size, seed=args.seed, run_dir=f"{tmp}/run", device="cpu")
        keys |= dict(optimizer=functools.partial(torch.optim.Adam, lr=args.lr), world_size=2, backend="gloo")
        train, val = (functools.partial(digits_like, n, seed) for n, seed in ((args.samples, 1), (args.val_samples, 2)))
        Trainer(functools.partial(make_model, tuple(args.hidden)), LOSS, train, val, metrics=["accuracy"], **keys).fit()
        rows = [r for r in read_metrics(f"{tmp}/run") if "epoch" in r]
        weights = torch.load(f"{tmp}/run/checkpoints/latest.pt", weights_only=True)["state"]["model"]
    monitor, best, saves = keys.get("monitor", "val/loss"), None, 0
    for r in rows:  # the checkpoints written after the timed epochs: whenever the monitored value improved
        if (score := r.get(monitor)) is not None and (best is None or (score > best) == (keys.get("mode") == "max")):
            best, saves = score, saves + (1 < r["epoch"] < args.epochs)
    walls = [r["wall_time"] for r in rows]  # row e written at the end of epoch e; the last holds the final test
    cycle = [None] + [b - a for a, b in zip(walls, walls[1:], strict=False)][:-1]
    return {"train": [r["time/epoch_s"] for r in rows], "cycle": cycle, "weights": weights, "ckpts": saves}


def define_lightning() -> None:
    """``LitMLP`` and ``EpochTimer`` in this module: here and in Lightning's spawned ranks, which unpickle them."""
    import pytorch_lightning as pl

    class LitMLP(pl.LightningModule):
        def __init__(self, model, args):
            super().__init__()
            self.model, self.args = model, args

        def training_step(self, batch, i):
            loss = LOSS(self.model(batch[0]), batch[1])
            self.log("train/loss", loss, on_step=False, on_epoch=True, sync_dist=True, batch_size=len(batch[1]))
            return loss

        def validation_step(self, batch, i):
            (x, y), log = batch, functools.partial(self.log, sync_dist=True, batch_size=len(batch[1]))
            out = self.model(x)
            log("val/loss", LOSS(out, y))
            log("val/accuracy", (out.argmax(1) == y).float().mean())

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=self.args.lr)

        def train_dataloader(self):
            return loaders(self.args, self.trainer.global_rank, self.trainer.world_size)[0]

        def val_dataloader(self):
            return loaders(self.args, self.trainer.global_rank, self.trainer.world_size)[1]

    class EpochTimer(pl.Callback):  # rank 0's epoch starts and last batch ends
        def __init__(self, path):
            self.path, self.starts, self.ends, self.last = path, [], [], 0.0

        def on_train_epoch_start(self, trainer, module):
            self.starts.append(time.perf_counter())

        def on_train_batch_end(self, trainer, module, outputs, batch, i):
            self.last = time.perf_counter()

        def on_validation_epoch_start(self, trainer, module):
            self.ends += [self.last] if trainer.training else []

        def on_train_epoch_end(self, trainer, module):
            self.ends += [self.last] if len(self.ends) < len(self.starts) else []  # no validation this epoch

        def on_train_end(self, trainer, module):
            if trainer.global_rank == 0:
                Path(self.path).write_text(json.dumps([self.starts, self.ends]))

    for cls in (LitMLP, EpochTimer):
        cls.__module__, cls.__qualname__ = __name__, cls.__name__
        globals()[cls.__name__] = cls


if os.environ.get(LIGHTNING) == "1" and __name__ != "__main__":
    define_lightning()  # a spawned Lightning rank (this module imported as __mp_main__)


def run_lightning(args, minimal: bool) -> dict:
    import warnings

    import pytorch_lightning as pl

    off = dict(enable_checkpointing=False, logger=False, enable_progress_bar=False, enable_model_summary=False)
    os.environ[LIGHTNING] = "1"
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*(num_workers|does not have many workers|sync_dist).*")
        torch.manual_seed(args.seed)
        lit = LitMLP(make_model(tuple(args.hidden)), args)  # noqa: F821 (define_lightning's)
        keys = dict(num_sanity_val_steps=0, use_distributed_sampler=False, default_root_dir=tmp, max_epochs=args.epochs)
        keys |= dict(accelerator="cpu", devices=2, strategy="ddp_spawn", **(off if minimal else {}))
        trainer = pl.Trainer(callbacks=[EpochTimer(f"{tmp}/epochs.json")], **keys)  # noqa: F821
        try:
            trainer.fit(lit)  # the spawn launcher loads rank 0's final weights back into ``lit``
        finally:
            os.environ.pop(LIGHTNING, None)
        starts, ends = json.loads(Path(f"{tmp}/epochs.json").read_text())
    weights = {k: v.detach().clone() for k, v in lit.model.state_dict().items()}
    cycle = [b - a for a, b in zip(starts, starts[1:], strict=False)]
    train = [e - s for s, e in zip(starts, ends, strict=False)]
    return {"train": train, "cycle": cycle, "weights": weights, "ckpts": "0" if minimal else "every epoch"}


def main() -> None:
    p = h.parser(__doc__)
    p.add_argument("--epochs", type=int, default=8, help="epochs per run (>= 3; epochs 2..E-1 are timed)")
    p.add_argument("--samples", type=int, default=60_000, help="training samples")
    p.add_argument("--val-samples", type=int, default=10_000, help="validation samples")
    p.add_argument("--batch-size", type=int, default=64, help="samples per batch on each rank")
    p.add_argument("--hidden", type=int, nargs="+", default=[256, 256], help="hidden layer widths")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--repeats", type=int, default=3, help="runs of every row, rotated; 0: the paired comparison only")
    p.add_argument("--skip-lightning", action="store_true")
    p.add_argument("--paired", type=int, default=10, metavar="EPOCHS", help="epochs of each arm (0: none)")
    p.add_argument("--max-other", type=float, default=0.2, help="a run while others used more cores is redone")
    p.add_argument("--retries", type=int, default=2, help="redos of a contended run (the least contended kept)")
    args = p.parse_args()
    plan = {"plain": functools.partial(in_ranks, plain_rank)}
    plan |= {name: functools.partial(run_ddprl, variant=name) for name in VARIANTS}
    if not args.skip_lightning:
        define_lightning()
        plan["lightning default"] = functools.partial(run_lightning, minimal=False)
        plan["lightning minimal"] = functools.partial(run_lightning, minimal=True)

    def timed(run, r: int) -> dict:
        before, result = h.cpu_counters(), run(args)
        result |= {k: statistics.median(v for v in result[k][1 : args.epochs - 1] if v) for k in ("train", "cycle")}
        result["other"] = h.foreign_load(before, h.cpu_counters())
        return {**result, "say": f"train {result['train']:.3f} s, cycle {result['cycle']:.3f} s a median epoch"}

    jobs = {name: functools.partial(timed, run) for name, run in plan.items()}
    runs = h.alternate(jobs, args.repeats, max_other=args.max_other, retries=args.retries)
    paired = in_ranks(paired_rank, args) if args.paired else None

    def report() -> None:
        print(f"{h.machine()}; {args.samples:,} samples, MLP {args.hidden}, batch {args.batch_size} x 2 ranks\n")
        rows, base = [], runs.get("plain", [])
        for name, rs in runs.items() if args.repeats else ():
            if any("error" in r for r in rs + base):
                rows.append([name, "failed"])
                continue
            vs = lambda k: f"{h.median(r[k] / b[k] - 1 for r, b in zip(rs, base, strict=True)):+.1%}"  # noqa: E731
            spread = lambda k: f"{h.median(v := [r[k] for r in rs]):.3f} ({min(v):.3f}-{max(v):.3f})"  # noqa: E731
            pairs = [(r["weights"][k], b["weights"][k]) for r, b in zip(rs, base, strict=True) for k in r["weights"]]
            diff = max(float((a.double() - b.double()).abs().max()) for a, b in pairs)
            ckpts = "/".join(str(r["ckpts"]) for r in rs) if isinstance(rs[0]["ckpts"], int) else rs[0]["ckpts"]
            name += "*" * any(r["other"] > args.max_other for r in rs)  # contended
            cells = [spread("train"), vs("train"), spread("cycle"), vs("cycle")]
            rows.append([name, *cells, f"{args.samples / h.median(r['train'] for r in rs):,.0f}", ckpts, f"{diff:.3g}"])
        if rows:
            head = ["row", "train s/epoch", "train vs plain", "cycle s/epoch", "cycle vs plain", "samples/s (train)"]
            h.table([*head, "ckpts in timed epochs", "max abs weight diff vs plain"], rows)
        if paired:
            print(f"\nPaired: {args.paired} epochs each, the first dropped; {paired['steps']} steps an epoch a rank\n")
            rows, times = [], {k: v[1:] for k, v in paired["times"].items()}
            for name, values in times.items():
                base = {PIECES[1]: PIECES[0], PIECES[3]: PIECES[2]}.get(name)
                ratios = [a / b - 1 for a, b in zip(values, times.get(base, values), strict=True)]
                ratio = f"{h.median(ratios):+.1%} ({min(ratios):+.1%} .. {max(ratios):+.1%})" * bool(base)
                per_step = f"{1e3 * h.median(values) / paired['steps']:.3f} ms" * ("train" in name)
                rows.append([name, f"{h.median(values):.4f}", per_step, ratio])
            h.table(["piece", "median s/epoch", "per step", "ddprl / plain (paired median, min-max)"], rows)

    h.report(report, args.report)


if __name__ == "__main__":
    main()
