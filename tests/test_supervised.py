"""The supervised Trainer on real 2-rank gloo jobs: DDP == one process, exact metrics, early stopping, resume."""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
import time

import pytest
import supervised_fns as fns
import torch
from conftest import REPO, cli_env, run_cli
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from ddprl.config import load_config
from ddprl.errors import UsageError
from ddprl.metrics import read_metrics
from ddprl.runtime import launch
from ddprl.runtime.compat import COMPILED_PREFIX
from ddprl.supervised import EarlyStopping, Trainer
from ddprl.supervised.data import EpochSampler, ShardSampler, eval_loader, start_epoch, train_loader
from ddprl.supervised.metrics import accuracy, mae, mse

FAST = {"progress": False, "device": "cpu", "dist_timeout": 60}


# -- pieces ------------------------------------------------------------------------------------


@pytest.mark.parametrize("n,world", [(37, 2), (1, 2), (10, 3), (64, 4), (5, 8)])
def test_shards_cover_every_sample_exactly_once(n, world):
    shards = [list(ShardSampler(n, r, world)) for r in range(world)]
    assert sorted(i for s in shards for i in s) == list(range(n))
    assert [i for s in shards for i in s] == list(range(n))  # rank order = the set's own order
    assert max(map(len, shards)) - min(map(len, shards)) <= 1
    # What the flawed trainers use: DistributedSampler pads to a multiple of the world size.
    padded = sum(
        len(list(DistributedSampler(range(n), num_replicas=world, rank=r, shuffle=False))) for r in range(world)
    )
    assert padded == n + (-n) % world


@pytest.mark.parametrize("drop_last", [False, True])
def test_tensor_datasets_load_a_batch_at_once_and_give_the_same_batches(drop_last):
    """A TensorDataset is indexed with the batch's indices at once: the batches (values, order, type) of torch's
    per-sample loader, on every rank, after a part-way start and when evaluating."""
    dataset = TensorDataset(torch.arange(37.0).unsqueeze(1).repeat(1, 3), torch.arange(37) % 5)
    cfg = load_config(["algo=supervised", "batch_size=4", "eval_batch_size=5", f"drop_last={drop_last}"])
    for rank in range(2):
        loader = train_loader(dataset, cfg, rank, 2)
        assert loader.batch_size is None  # the batched path: no per-sample collate
        plain = EpochSampler(dataset, num_replicas=2, rank=rank, seed=cfg.seed, drop_last=drop_last)
        for epoch, skip in ((0, 0), (1, 8), (2, 0)):
            start_epoch(loader, epoch, skip)
            plain.start_at(epoch, skip)
            got = list(loader)
            expected = list(DataLoader(dataset, cfg.batch_size, sampler=plain, drop_last=drop_last))
            assert len(got) == len(expected) == len(loader) and all(type(b) is list for b in got)
            assert all(torch.equal(g, e) for b, c in zip(got, expected, strict=True) for g, e in zip(b, c, strict=True))
        got = list(eval_loader(dataset, cfg, rank, 2))
        expected = list(DataLoader(dataset, 5, sampler=ShardSampler(37, rank, 2)))
        assert all(torch.equal(g, e) for b, c in zip(got, expected, strict=True) for g, e in zip(b, c, strict=True))


def test_early_stopping_counts_validations_without_improvement():
    stopper = EarlyStopping(mode="max", patience=2, min_delta=0.01)
    assert [stopper.update(v) for v in (0.5, 0.6, 0.605, 0.7, 0.7, 0.69)] == [False, False, False, False, False, True]
    assert stopper.best == 0.7
    copy = EarlyStopping(mode="max", patience=2)
    copy.load_state_dict(stopper.state_dict())
    assert copy.state_dict() == stopper.state_dict()
    more_patience = EarlyStopping(mode="max", patience=3)
    more_patience.load_state_dict(stopper.state_dict())
    assert not more_patience.stopped and more_patience.update(0.7)  # a third one without improvement
    assert not EarlyStopping(patience=0).update(float("nan"))  # patience 0: never stops
    nan = EarlyStopping(patience=1)
    nan.update(1.0)
    assert nan.update(float("nan"))  # NaN is never an improvement
    lower = EarlyStopping(mode="min", patience=2, min_delta=0.1)  # an improvement is below best - 0.1
    assert [lower.update(v) for v in (1.0, 0.95, 0.85, 0.8, 0.76)] == [False, False, False, False, True]
    assert lower.best == 0.85


def test_one_entry_of_task_options_on_the_command_line():
    cfg = load_config(["algo=supervised", "task_options.split_seed=3", "task_options.num_graphs=40"])
    assert cfg.task_options == {"split_seed": 3, "num_graphs": 40}
    with pytest.raises(UsageError, match="unknown key 'epochs.x'"):
        load_config(["algo=supervised", "epochs.x=1"])  # only dict-valued keys have entries


def test_builtin_metrics_per_sample():
    logits = torch.tensor([[2.0, 1.0], [0.0, 3.0], [1.0, 0.0]])
    assert accuracy(logits, torch.tensor([0, 1, 1])).tolist() == [1.0, 1.0, 0.0]
    assert accuracy(torch.tensor([[0.3], [-2.0]]), torch.tensor([1, 1])).tolist() == [1.0, 0.0]  # one logit
    assert accuracy(torch.tensor([0.3, -2.0, 1.0]), torch.tensor([1, 0, 0])).tolist() == [1.0, 1.0, 0.0]  # (N,)
    out, target = torch.tensor([[1.0, 3.0], [0.0, 0.0]]), torch.tensor([[0.0, 1.0], [0.0, 2.0]])
    assert mse(out, target).tolist() == [2.5, 2.0]
    assert mae(out, target).tolist() == [1.5, 1.0]


# -- exact evaluation --------------------------------------------------------------------------


def _evaluate(tmp_path, world_size, task, split="val", eval_batch_size=4):
    cfg = load_config(
        [
            "algo=supervised",
            f"world_size={world_size}",
            f"eval_batch_size={eval_batch_size}",
            "progress=false",
            "device=cpu",
            "dist_timeout=60",
        ]
    )
    out = tmp_path / f"w{world_size}"
    out.mkdir()
    launch(functools.partial(fns.evaluate_fixed, task=task, split=split, out=str(out)), cfg)
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(world_size)]


class OneRank:
    """The runtime ``evaluate`` sees on one rank: sums over ranks are the rank's own."""

    device = torch.device("cpu")

    def all_reduce_sum(self, value):
        return value


def test_evaluate_runs_the_model_in_eval_mode_and_restores_training():
    """Dropout is off while evaluating (the result is the eval-mode model's, computed here), and the
    model is left training as it came."""
    from ddprl.supervised import Task
    from ddprl.supervised.metrics import evaluate

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.Dropout(0.9), nn.Linear(16, 3)).train()
    x, y = fns.blobs(20).tensors
    task = Task(model=lambda: model, loss=nn.CrossEntropyLoss(), metrics={"accuracy": fns.accuracy})
    result = evaluate(OneRank(), model, [(x[:8], y[:8]), (x[8:], y[8:])], task, "val")
    assert model.training
    model.eval()
    with torch.no_grad():
        out = model(x)
    assert result["val/num_samples"] == 20
    assert result["val/loss"] == pytest.approx(float(nn.functional.cross_entropy(out, y)), rel=1e-6)
    assert result["val/accuracy"] == int((out.argmax(1) == y).sum()) / 20


def test_val_metrics_count_every_sample_once_and_equal_one_process(tmp_path):
    task = fns.blob_task(n_val=37)  # 37 = not a multiple of world_size x batch
    (one,) = _evaluate(tmp_path, 1, task)
    two = _evaluate(tmp_path, 2, task)
    assert two[0] == two[1]  # every rank has the global result
    assert two[0]["val/num_samples"] == one["val/num_samples"] == 37
    assert two[0]["val/accuracy"] == one["val/accuracy"]  # counts: exact
    # The loss is a float32 mean inside each batch, and the batches differ (shards of 18 and 19
    # in 4s vs 37 in 4s): equal to float32 rounding.
    assert two[0]["val/loss"] == pytest.approx(one["val/loss"], rel=1e-6)
    # ... and equal to the metric computed directly on the whole set
    torch.manual_seed(0)
    model = task.model()
    x, y = task.val().tensors
    with torch.no_grad():
        out = model(x)
    assert one["val/loss"] == pytest.approx(float(nn.functional.cross_entropy(out, y)), rel=1e-6)
    assert one["val/accuracy"] == int((out.argmax(1) == y).sum()) / 37


@pytest.mark.slow
def test_torchmetrics_objects_reduce_over_uneven_shards(tmp_path):
    torchmetrics = pytest.importorskip("torchmetrics")
    task = fns.blob_task(n_val=37)
    task.metrics = {"f1": torchmetrics.classification.MulticlassF1Score(num_classes=3, average="macro")}
    (one,) = _evaluate(tmp_path, 1, task)
    two = _evaluate(tmp_path, 2, task)
    assert two[0]["val/f1"] == two[1]["val/f1"] == pytest.approx(one["val/f1"], rel=1e-6)


# -- training: DDP == one process, early stopping, precision -----------------------------------


def _weights(run_dir):
    ckpt = torch.load(run_dir / "checkpoints" / "latest.pt", map_location="cpu", weights_only=True)
    return ckpt["state"]["model"]


@pytest.mark.parametrize("sync_freq", [1, 2])
@pytest.mark.slow
def test_two_ranks_equal_one_process_on_the_full_batch(tmp_path, sync_freq):
    """2 ranks x batch 8 (x sync_freq) == 1 process x batch 16 (x sync_freq), over 2 shuffled epochs."""
    task = fns.blob_task(n_train=96)
    keys = dict(FAST, epochs=2, optimizer="sgd", lr=0.2, momentum=0.0, sync_freq=sync_freq, shuffle=True)
    two = Trainer.from_task(task, world_size=2, batch_size=8, run_dir=str(tmp_path / "two"), **keys).fit()
    one = Trainer.from_task(task, world_size=1, batch_size=16, run_dir=str(tmp_path / "one"), **keys).fit()
    a, b = _weights(two.run_dir), _weights(one.run_dir)
    torch.manual_seed(1)  # the init both started from: rank 0's seed
    init = fns.small_mlp().state_dict()
    for name in a:
        assert not torch.allclose(a[name], init[name])  # it trained
        torch.testing.assert_close(a[name], b[name], rtol=1e-5, atol=1e-6)
    steps = [r["step"] for r in read_metrics(two.run_dir) if "epoch" in r]
    assert steps == [6 // sync_freq, 12 // sync_freq]  # 96 / (2 x 8) = 6 micro-batches per epoch
    assert read_metrics(two.run_dir)[-1]["train/effective_batch_size"] == 16 * sync_freq


def test_early_stopping_is_global_and_the_same_on_every_rank(tmp_path):
    """Rank 0's val shard gets worse every epoch while the whole set improves: the job goes on."""
    cfg = load_config(
        [
            "algo=supervised",
            "task=python",
            "world_size=2",
            "epochs=30",
            "batch_size=8",
            "patience=2",
            "checkpoint_freq=1",
            "keep_last=0",
            "progress=false",
            "device=cpu",
            "dist_timeout=60",
            f"run_dir={tmp_path / 'run'}",
            "eval_batch_size=3",
        ]
    )
    launch(functools.partial(fns.fit_and_record, task=fns.disagreeing_task(), out=str(tmp_path)), cfg)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for record in ranks:  # wall-clock times are each rank's own
        record["metrics"] = {k: v for k, v in record["metrics"].items() if not k.startswith("time/")}
    assert ranks[0] == ranks[1] and ranks[0]["stopped"]
    stop_epoch = ranks[0]["epochs"]
    # The weight after each epoch (one checkpoint per epoch) gives rank 0's shard loss w^2:
    ckpts = sorted((tmp_path / "run" / "checkpoints").glob("step_*.pt"), key=lambda p: int(p.stem[5:]))
    w = [float(torch.load(p, weights_only=True)["state"]["model"]["weight"]) for p in ckpts]
    assert len(w) == stop_epoch and all(a < b for a, b in zip(w, w[1:], strict=False))
    shard_only = EarlyStopping(patience=2)
    shard_stop = next(e for e, wi in enumerate(w, 1) if shard_only.update(wi**2))
    assert shard_stop == 3 < stop_epoch  # a decision from rank 0's shard would have stopped at epoch 3
    # The job stopped where the *global* loss stopped improving, and one process stops there too.
    global_loss = [(wi**2 + 9 * (wi - 1) ** 2) / 2 for wi in w]
    best = global_loss.index(min(global_loss)) + 1
    assert stop_epoch == best + 2
    one = Trainer.from_task(
        fns.disagreeing_task(),
        world_size=1,
        epochs=30,
        batch_size=16,
        patience=2,
        run_dir=str(tmp_path / "one"),
        **FAST,
    ).fit()
    assert one.epochs == stop_epoch and one.stopped_early


@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
def test_resume_restores_the_optimizer_state_and_continues_like_an_uninterrupted_run(tmp_path, optimizer):
    """One epoch, then resumed for a second: the weights equal those of two epochs in one run. With
    Adam's moments or SGD's momentum buffer (optimizers that have a state) a resume that rebuilt the
    optimizer fresh would step differently from the first step on."""
    keys = dict(FAST, batch_size=8, optimizer=optimizer, lr=0.01, momentum=0.9, shuffle=True, world_size=1)
    whole = Trainer.from_task(fns.blob_task(), run_dir=str(tmp_path / "whole"), epochs=2, **keys).fit()
    cut = tmp_path / "cut"
    Trainer.from_task(fns.blob_task(), run_dir=str(cut), epochs=1, **keys).fit()
    first = torch.load(cut / "checkpoints" / "latest.pt", weights_only=True)
    assert first["counters"]["epoch"] == 1 and first["state"]["optimizer"]["state"]  # a state to restore
    resumed = Trainer.from_task(fns.blob_task(), run_dir=str(cut), epochs=2, resume="auto", **keys).fit()
    a, b = _weights(whole.run_dir), _weights(resumed.run_dir)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], first["state"]["model"][k]) for k in a)  # the second epoch moved them


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_mixed_precision_trains(tmp_path, precision):
    result = Trainer.from_task(
        fns.blob_task(),
        world_size=1,
        epochs=3,
        batch_size=16,
        precision=precision,
        run_dir=str(tmp_path / precision),
        **FAST,
    ).fit()
    rows = [r for r in read_metrics(result.run_dir) if "epoch" in r]
    assert rows[-1]["train/loss"] < rows[0]["train/loss"]
    state = torch.load(result.run_dir / "checkpoints" / "latest.pt", weights_only=True)["state"]
    assert (state["scaler"] != {}) == (precision == "fp16")  # fp16 only: a gradient scaler with its scale


def test_trainer_python_api_with_datasets_and_names(tmp_path):
    """Datasets (not factories) and metric names, the way a notebook user writes it."""
    result = Trainer(
        model=fns.small_mlp,
        loss=nn.CrossEntropyLoss(),
        train=fns.blobs(64, 1),
        val=fns.blobs(21, 2),
        test=fns.blobs(11, 3),
        metrics=["accuracy"],
        world_size=2,
        epochs=2,
        batch_size=8,
        monitor="val/accuracy",
        mode="max",
        run_dir=str(tmp_path / "api"),
        **FAST,
    ).fit()
    assert result.metrics["val/num_samples"] == 21 and result.metrics["test/num_samples"] == 11
    assert result.best_checkpoint is not None and result.best_checkpoint.exists()
    trainer = Trainer(
        model=fns.small_mlp,
        loss=nn.CrossEntropyLoss(),
        train=fns.blobs(64, 1),
        test=fns.blobs(11, 3),
        metrics=["accuracy"],
    )
    tested = trainer.test(result.best_checkpoint, device="cpu")
    assert tested["test/num_samples"] == 11
    assert tested["test/accuracy"] == pytest.approx(result.metrics["test/accuracy"])


def test_unpicklable_factories_fail_before_spawning(tmp_path):
    trainer = Trainer(
        model=lambda: nn.Linear(6, 3),
        loss=nn.CrossEntropyLoss(),
        train=fns.blobs(16),
        world_size=2,
        run_dir=str(tmp_path / "never"),
        **FAST,
    )
    with pytest.raises(UsageError, match="module level"):
        trainer.fit()
    assert not (tmp_path / "never").exists()


def test_monitor_must_be_measured(tmp_path):
    with pytest.raises(UsageError, match="no validation set"):
        Trainer(
            model=fns.small_mlp,
            loss=nn.CrossEntropyLoss(),
            train=fns.blobs(16),
            world_size=1,
            monitor="val/loss",
            **FAST,
        ).fit()
    # monitor=auto (the default) falls back to train/loss without a validation set
    result = Trainer(
        model=fns.small_mlp,
        loss=nn.CrossEntropyLoss(),
        train=fns.blobs(16),
        world_size=1,
        epochs=2,
        run_dir=str(tmp_path / "r"),
        **FAST,
    ).fit()
    assert result.best_checkpoint is not None and "val/loss" not in result.metrics


# -- the command line: digits, kill -9 and resume, eval, user tasks ----------------------------


@pytest.mark.slow
def test_digits_reaches_test_accuracy_095_on_two_ranks(tmp_path):
    run_dir = tmp_path / "digits"
    proc = run_cli(
        [
            "train",
            "algo=supervised",
            "task=digits",
            "world_size=2",
            f"run_dir={run_dir}",
            "progress=false",
            "device=cpu",
        ]
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    last = read_metrics(run_dir)[-1]
    assert last["test/num_samples"] == 271 and last["val/num_samples"] == 269
    assert last["test/accuracy"] >= 0.95, last
    proc = run_cli(["eval", f"checkpoint={run_dir / 'checkpoints' / 'best.pt'}", "device=cpu"])
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"test/accuracy={last['test/accuracy']:.6g}" in proc.stdout and "test/num_samples=271" in proc.stdout


@pytest.mark.slow
def test_signal_mid_epoch_saves_there_and_resume_equals_an_uninterrupted_run(tmp_path):
    """SIGTERM to rank 1 part-way through epoch 1: both ranks stop after the same optimizer step,
    save (epoch, batch, the epoch's partial sums), exit 75; the resumed run ends with the weights
    and rows of a run never stopped."""
    keys = dict(
        FAST,
        epochs=3,
        batch_size=2,
        optimizer="sgd",
        lr=0.05,
        momentum=0.0,
        shuffle=True,
        checkpoint_freq=0,
        world_size=2,
    )
    whole = Trainer.from_task(fns.long_blob_task(), run_dir=str(tmp_path / "whole"), **keys).fit()
    cut = tmp_path / "cut"
    with pytest.raises(SystemExit) as stopped:
        Trainer.from_task(fns.long_blob_task(signal_at=100), run_dir=str(cut), **keys).fit()
    assert stopped.value.code == 75
    counters = torch.load(cut / "checkpoints" / "latest.pt", weights_only=True)["counters"]
    assert 0 < counters["batches"] < 300 and counters["epoch"] < 3, counters  # mid-epoch
    resumed = Trainer.from_task(fns.long_blob_task(), run_dir=str(cut), resume="auto", **keys).fit()
    a, b = _weights(whole.run_dir), _weights(resumed.run_dir)
    assert all(torch.equal(a[k], b[k]) for k in a)
    rows_whole = [r for r in read_metrics(whole.run_dir) if "epoch" in r]
    rows_cut = [r for r in read_metrics(cut) if "epoch" in r]
    assert [r["epoch"] for r in rows_cut] == [1, 2, 3]
    for x, y in zip(rows_whole, rows_cut, strict=True):  # the interrupted epoch's loss includes both parts
        assert x["train/loss"] == pytest.approx(y["train/loss"], rel=1e-12) and x["val/loss"] == y["val/loss"]


@pytest.mark.slow
def test_kill_9_and_resume_continues_like_an_uninterrupted_run(tmp_path):
    args = [
        "train",
        "algo=supervised",
        "task=digits",
        "world_size=2",
        "epochs=8",
        "batch_size=8",
        "checkpoint_freq=1",
        "progress=false",
        "device=cpu",
        "dist_timeout=60",
    ]
    whole = tmp_path / "whole"
    assert run_cli(args + [f"run_dir={whole}"]).returncode == 0
    cut = tmp_path / "cut"
    proc = subprocess.Popen(
        [sys.executable, "-m", "ddprl", *args, f"run_dir={cut}"],
        env=cli_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.time() + 120
        while not (cut / "checkpoints" / "step_316.pt").exists():  # epoch 2 of 8 (158 steps per epoch)
            assert time.time() < deadline and proc.poll() is None, "the run ended before it could be killed"
            time.sleep(0.01)
        os.killpg(proc.pid, signal.SIGKILL)  # the whole job: launcher and both ranks
    finally:
        proc.kill()
        proc.wait()
    killed_at = torch.load(cut / "checkpoints" / "latest.pt", weights_only=True)["counters"]["epoch"]
    assert 2 <= killed_at < 8, killed_at
    proc = run_cli(args + [f"run_dir={cut}", "resume=auto"])
    assert proc.returncode == 0, proc.stderr[-2000:]
    # Same data order, optimizer and RNG: the same weights, bit for bit, and the same curves.
    a, b = _weights(whole), _weights(cut)
    assert all(torch.equal(a[k], b[k]) for k in a)
    rows_whole = [r for r in read_metrics(whole) if "epoch" in r]
    rows_cut = [r for r in read_metrics(cut) if "epoch" in r]
    assert [r["epoch"] for r in rows_cut] == list(range(1, 9))  # no row twice, none missing
    for x, y in zip(rows_whole, rows_cut, strict=True):
        assert x["train/loss"] == y["train/loss"] and x["val/loss"] == y["val/loss"]
    # Plain state dicts only: the file loads with weights_only=True and names no wrapper.
    ckpt = torch.load(cut / "checkpoints" / "latest.pt", weights_only=True)
    assert not any(k.startswith(("module.", COMPILED_PREFIX)) for k in ckpt["state"]["model"])
    assert set(ckpt["state"]) == {"model", "optimizer", "scheduler", "scaler", "early_stopping"}


@pytest.mark.slow
def test_user_task_from_the_command_line_and_no_import_from_a_checkpoint(tmp_path):
    tests = REPO / "tests"
    run_dir = tmp_path / "user"
    base = ["train", "algo=supervised", "world_size=1", "epochs=2", "progress=false", "device=cpu"]
    proc = run_cli(base + ["task=supervised_fns:tiny_task", f"run_dir={run_dir}"], cwd=tests)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert read_metrics(run_dir)[-1]["test/num_samples"] == 29
    ckpt = run_dir / "checkpoints" / "latest.pt"
    # Resuming or evaluating never imports the module the checkpoint names: it must be named again.
    proc = run_cli(base + [f"resume={ckpt}", "epochs=3"], cwd=tests)
    assert proc.returncode == 2 and "add task=supervised_fns:tiny_task" in proc.stderr
    proc = run_cli(["eval", f"checkpoint={ckpt}"], cwd=tests)
    assert proc.returncode == 2 and "add task=supervised_fns:tiny_task" in proc.stderr
    proc = run_cli(["eval", f"checkpoint={ckpt}", "task=supervised_fns:tiny_task", "split=val"], cwd=tests)
    assert proc.returncode == 0 and "val/num_samples=37" in proc.stdout, proc.stderr[-2000:]


@pytest.mark.parametrize(
    "args,message",
    [
        (["task=digit"], "did you mean digits"),
        (["task=nomodule:fn"], "cannot import module 'nomodule'"),
        (["monitor=val/acc"], "measures val/loss, val/accuracy"),
        (["mode=up"], "mode='up' is not min or max"),
        (["prefetch_factor=2"], "needs num_workers > 0"),
        (["task_options={size: 3}"], "no option(s) size"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, args, message):
    proc = run_cli(["train", "algo=supervised", "world_size=1", f"run_dir={tmp_path / 'x'}", *args])
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert not (tmp_path / "x").exists()
