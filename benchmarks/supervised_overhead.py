"""Supervised epoch time: ddprl's Trainer against a plain PyTorch DDP loop, the same MLP, data (noisy resampled
digits), batches, seed and initial weights, 2 gloo ranks of one thread; epochs 2..E-1 of each run timed (median), the
median over --repeats rotated. train: the training pass; cycle: an epoch's start to the next's (validation,
checkpoint, logging).

    python benchmarks/supervised_overhead.py [--repeats 3] [--epochs 8] [--samples 60000]
"""

from __future__ import annotations

import functools
import json
import statistics
import tempfile
import time
from pathlib import Path

import harness as h
import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from ddprl.metrics import read_metrics
from ddprl.runtime import launch
from ddprl.supervised import Trainer

LOSS = nn.CrossEntropyLoss()
VARIANTS = {  # eval_freq None: the last epoch only, outside the epochs timed
    "ddprl default": {},
    "ddprl val, no ckpt": {"monitor": "train/loss", "mode": "max"},  # "improved" (nearly) never: no checkpoint
    "ddprl minimal": {"eval_freq": None, "progress": False},
}


def digits_like(n: int, seed: int) -> TensorDataset:
    """``n`` resampled standardised digits with Gaussian noise (sigma 0.5), from their own generator."""
    from sklearn.datasets import load_digits

    (x, y), g = load_digits(return_X_y=True), torch.Generator().manual_seed(seed)
    x, y = torch.as_tensor(x, dtype=torch.float32), torch.as_tensor(y)
    x, idx = (x - x.mean(0)) / x.std(0).clamp_min(1e-6), torch.randint(0, len(x), (n,), generator=g)
    return TensorDataset(x[idx] + 0.5 * torch.randn(n, x.shape[1], generator=g), y[idx])


def make_model(hidden: tuple[int, ...]) -> nn.Sequential:
    sizes = [64, *hidden, 10]
    layers = [m for a, b in zip(sizes, sizes[1:], strict=False) for m in (nn.Linear(a, b), nn.ReLU())]
    return nn.Sequential(*layers[:-1])


def plain_rank(rt, cfg, args, folder: str) -> None:
    """torch's DDP and a plain loop in ddprl's 2 ranks (DistributedSampler batches, each rank a contiguous part of the
    validation set; each epoch's mean loss, then validation loss and accuracy, all-reduced); rank 0's weights are
    ``torch.manual_seed(seed)``'s."""
    torch.manual_seed(args.seed + rt.rank)
    model, rank, world = make_model(tuple(args.hidden)), rt.rank, rt.world_size
    train, val = digits_like(args.samples, 1), digits_like(args.val_samples, 2)
    sampler = DistributedSampler(train, num_replicas=world, rank=rank, shuffle=True, seed=args.seed)
    shard = range(rank * len(val) // world, (rank + 1) * len(val) // world)
    loader, val_loader = (DataLoader(d, args.batch_size, sampler=s) for d, s in ((train, sampler), (val, shard)))
    net, opt = nn.parallel.DistributedDataParallel(model), torch.optim.Adam(model.parameters(), lr=args.lr)
    starts, train_s = [], []
    for epoch in range(args.epochs):
        starts.append(time.perf_counter())
        sampler.set_epoch(epoch)
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
        train_s.append(time.perf_counter() - starts[-1])
        model.eval()
        sums = torch.zeros(3, dtype=torch.float64)
        with torch.no_grad():
            for x, y in val_loader:
                logits = model(x)
                sums[0] += LOSS(logits, y).double() * len(y)
                sums[1] += (logits.argmax(1) == y).sum()
                sums[2] += len(y)
        dist.all_reduce(sums)
    if rt.is_main:
        torch.save(model.state_dict(), Path(folder) / "weights.pt")
        cycle = [b - a for a, b in zip(starts, starts[1:], strict=False)]
        (Path(folder) / "result.json").write_text(json.dumps({"train": train_s, "cycle": cycle, "ckpts": 0}))


def run_plain(args) -> dict:
    """:func:`plain_rank` on 2 gloo ranks started by ddprl: what rank 0 wrote, and its weights."""
    with tempfile.TemporaryDirectory() as tmp:
        keys = dict(world_size=2, device="cpu", backend="gloo", batch_size=args.batch_size, seed=args.seed)
        cfg = Trainer(None, LOSS, [0], run_dir=f"{tmp}/run", **keys).config()
        launch(functools.partial(plain_rank, args=args, folder=tmp), cfg)
        result = json.loads((Path(tmp) / "result.json").read_text())
        return {**result, "weights": torch.load(Path(tmp) / "weights.pt", weights_only=True)}


def run_ddprl(args, variant: str) -> dict:
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


def main() -> None:
    p = h.parser(__doc__, repeats=3, contention=(0.2, 2))
    p.add_argument("--epochs", type=int, default=8, help="epochs per run (>= 3; epochs 2..E-1 are timed)")
    p.add_argument("--samples", type=int, default=60_000, help="training samples")
    p.add_argument("--val-samples", type=int, default=10_000, help="validation samples")
    p.add_argument("--batch-size", type=int, default=64, help="samples per batch on each rank")
    p.add_argument("--hidden", type=int, nargs="+", default=[256, 256], help="hidden layer widths")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args()

    def timed(run, r: int) -> dict:
        before, result = h.cpu_counters(), run(args)
        result |= {k: statistics.median(v for v in result[k][1 : args.epochs - 1] if v) for k in ("train", "cycle")}
        result["other"] = h.foreign_load(before, h.cpu_counters())
        return {**result, "say": f"train {result['train']:.3f} s, cycle {result['cycle']:.3f} s a median epoch"}

    plan = {"plain": functools.partial(timed, run_plain)}
    plan |= {name: functools.partial(timed, functools.partial(run_ddprl, variant=name)) for name in VARIANTS}
    runs = h.alternate(plan, args.repeats, max_other=args.max_other, retries=args.retries)

    print(f"{h.machine()}; {args.samples:,} samples, MLP {args.hidden}, batch {args.batch_size} x 2 ranks\n")
    rows, base = [], runs["plain"]
    for name, rs in runs.items():
        if any("error" in r for r in rs + base):
            rows.append([name, "failed"])
            continue
        vs = lambda k: f"{h.median(r[k] / b[k] - 1 for r, b in zip(rs, base, strict=True)):+.1%}"  # noqa: E731
        spread = lambda k: f"{h.median(v := [r[k] for r in rs]):.3f} ({min(v):.3f}-{max(v):.3f})"  # noqa: E731
        pairs = [(r["weights"][k], b["weights"][k]) for r, b in zip(rs, base, strict=True) for k in r["weights"]]
        diff = max(float((a.double() - b.double()).abs().max()) for a, b in pairs)
        name += "*" * any(r["other"] > args.max_other for r in rs)  # contended
        cells = [spread("train"), vs("train"), spread("cycle"), vs("cycle")]
        cells += [f"{args.samples / h.median(r['train'] for r in rs):,.0f}", "/".join(str(r["ckpts"]) for r in rs)]
        rows.append([name, *cells, f"{diff:.3g}"])
    head = ["row", "train s/epoch", "train vs plain", "cycle s/epoch", "cycle vs plain", "samples/s (train)"]
    h.table([*head, "ckpts in timed epochs", "max abs weight diff vs plain"], rows)


if __name__ == "__main__":
    main()
