"""QMIX's staged training with a graph reconstructer on SMAX's 3m, 2 gloo ranks, tiny sizes:
stage tokenizer -> stage mask_predictor -> stage qmix reconstruct=true (and the full-sight
oracle), each its own run directory chained by init_from; bad key combinations refused."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
from conftest import run_cli

from ddprl.metrics import read_metrics

pytestmark = pytest.mark.skipif(importlib.util.find_spec("jaxmarl") is None, reason="jaxmarl is not installed")

COMMON = [
    "algo=qmix",
    "task=smax/3m",
    "world_size=2",
    "num_envs=4",
    "progress=false",
    "dist_timeout=120",
]
# 2 x 6 random episodes, 16 codes of width 8, a 1-layer transformer of width 16
GRAPH = [
    "pretrain_episodes=12",
    "epochs=2",
    "node_batch_size=64",
    "num_codes=16",
    "code_dim=8",
    "node_hidden=16",
    "d_model=16",
    "n_heads=2",
    "n_layers=1",
    "ffn_dim=32",
]
QMIX = [
    "steps=1212",  # 808 of warm-up (2 envs per rank x 4 episodes of 101 steps), then 3 updates
    "batch_size=4",
    "buffer_size=16",
    "update_every=202",
    "env_kwargs.time_limit=101",
    "eval_freq=0",
    "eval_episodes=2",
    "checkpoint_freq=0",
]


def ckpt_of(run_dir, name="latest.pt"):
    return torch.load(run_dir / "checkpoints" / name, map_location="cpu", weights_only=True)


def train(*args):
    res = run_cli(["train", *COMMON, *args])
    assert res.returncode == 0, res.stderr[-3000:]
    return res


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory):
    """The three stages in one command, one run directory each; then the same command again."""
    root = tmp_path_factory.mktemp("stages") / "omagd"
    res = train(*GRAPH, *QMIX, "stage=pipeline", f"run_dir={root}")
    assert "a frozen reconstructer fills in what agents cannot see" in res.stderr
    again = train(*GRAPH, *QMIX, "stage=pipeline", f"run_dir={root}")
    return root, res.stderr, again.stderr


def test_the_pipeline_writes_one_run_directory_per_stage_and_a_rerun_does_nothing_twice(pipeline):
    root, _, again = pipeline
    assert sorted(p.name for p in root.iterdir()) == ["mask_predictor", "qmix", "tokenizer"]
    assert "stage=tokenizer finished at step" in again and "stage=mask_predictor finished at step" in again
    for stage in ("tokenizer", "mask_predictor", "qmix"):
        assert ckpt_of(root / stage)["config"]["stage"] == stage
    assert ckpt_of(root / "qmix")["config"]["reconstruct"] is True


def test_the_tokenizer_logs_codebook_use_and_reconstruction_per_epoch(pipeline):
    root = pipeline[0]
    rows = read_metrics(root / "tokenizer")
    assert [r["train/epoch"] for r in rows] == [1.0, 2.0]
    last = rows[-1]
    for key in ("train/loss", "train/recon_mse", "val/loss", "val/recon_mse", "val/perplexity", "val/codebook_usage"):
        assert key in last, key
    assert 1 <= last["val/perplexity"] <= 16 and 0 < last["val/codebook_usage"] <= 1
    assert rows[0]["step"] > 0 and rows[1]["step"] == 2 * rows[0]["step"]  # optimizer steps, as many per epoch
    assert set(ckpt_of(root / "tokenizer")["state"]["networks"]) == {"tokenizer"}


def test_the_mask_predictor_keeps_the_tokenizer_frozen_and_reports_the_baselines(pipeline):
    root = pipeline[0]
    tok = ckpt_of(root / "tokenizer", "best.pt")["state"]["networks"]["tokenizer"]
    pred = ckpt_of(root / "mask_predictor")["state"]["networks"]
    assert set(pred) == {"tokenizer", "predictor"}
    for k, v in tok.items():  # byte-identical: no gradient, no EMA update, no revival
        assert torch.equal(pred["tokenizer"][k], v), k
    last = read_metrics(root / "mask_predictor")[-1]
    for key in (
        "val/missing_token_accuracy",
        "val/missing_token_accuracy_nothing",
        "val/missing_token_accuracy_type_mean",
        "val/missing_feature_mse",
        "val/missing_feature_mse_nothing",
        "val/missing_feature_mse_type_mean",
        "val/missing_feature_mse_true_tokens",
    ):
        assert key in last, key
    assert 0 <= last["val/missing_token_accuracy"] <= 1


def test_qmix_on_reconstructed_observations_saves_the_reconstructer_and_evaluates_from_its_checkpoint(pipeline):
    root, stderr, _ = pipeline
    assert "trains agent, mixer" in stderr
    pred = root / "mask_predictor" / "checkpoints" / "best.pt"
    ckpt = ckpt_of(root / "qmix")
    assert ckpt["step"] == 1212 and ckpt["counters"]["updates"] == 3
    saved = ckpt["state"]["reconstructer"]["networks"]
    source = torch.load(pred, map_location="cpu", weights_only=True)["state"]["networks"]
    for name in ("tokenizer", "predictor"):
        for k, v in source[name].items():
            assert torch.equal(saved[name][k], v), (name, k)
    assert set(ckpt["state"]["networks"]) == {"agent", "mixer"}
    res = run_cli(["eval", f"checkpoint={root / 'qmix'}", "episodes=2", "device=cpu"])
    assert res.returncode == 0, res.stderr[-3000:]
    assert "return_mean=" in res.stdout and "episodes=2" in res.stdout


def test_the_full_sight_oracle_trains(tmp_path):
    train(*QMIX, "full_obs=true", f"run_dir={tmp_path / 'oracle'}")
    last = read_metrics(tmp_path / "oracle")[-1]
    assert last["step"] == 1212 and last["train/updates"] == 3


@pytest.mark.parametrize(
    "args, message",
    [
        (["stage=mask_predictor"], "stage=mask_predictor needs init_from=<a stage=tokenizer checkpoint>"),
        (["reconstruct=true"], "reconstruct=true needs init_from=<a stage=mask_predictor checkpoint>"),
        (["reconstruct=true", "INIT=tokenizer"], "hands on no reconstructer"),
        (["stage=mask_predictor", "INIT=mask_predictor", "num_codes=32"], "does not fit"),
        (["reconstruct=true", "full_obs=true"], "give one"),
        (["full_obs=true", "task=Foraging-5x5-2p-1f-v3"], "gives no full observation"),
        (["stage=tokenizer", "task=Foraging-5x5-2p-1f-v3"], "gives no full observation"),
        (["stage=tokenizer", "full_obs=true"], "keys of stage=qmix"),
        (["stage=nonsense.module:Stage"], "cannot load it"),
    ],
)
def test_bad_stage_combinations_are_refused_in_one_line(pipeline, tmp_path, args, message):
    root = pipeline[0]
    args = [
        f"init_from={root / a.removeprefix('INIT=') / 'checkpoints' / 'best.pt'}" if a.startswith("INIT=") else a
        for a in args
    ]
    run_dir = tmp_path / "never"
    res = run_cli(["train", *COMMON, *GRAPH, *args, f"run_dir={run_dir}"])
    assert res.returncode == 2, res.stderr[-2000:]
    assert message in res.stderr and "Traceback" not in res.stderr, res.stderr[-2000:]
    assert not run_dir.exists()


def test_agents_see_their_observations_with_the_unseen_nodes_filled_in(pipeline):
    from ddprl.algos.qmix.graph_stages import build_reconstructer, reconstructer_state
    from ddprl.algos.qmix.loop import seen_through
    from ddprl.envs.marl import make_marl_env

    root = pipeline[0]
    raw = make_marl_env("smax/3m", 2, seed=7)
    layout = raw.node_layout
    reconstructer = build_reconstructer(
        reconstructer_state(ckpt_of(root / "mask_predictor", "best.pt")), layout, "test"
    )
    seen = seen_through(make_marl_env("smax/3m", 2, seed=7), reconstructer)
    actions = torch.zeros(2, 3, dtype=torch.int64)
    for observed, filled in ((raw.reset(seed=7), seen.reset(seed=7)), (raw.step(actions)[0], seen.step(actions)[0])):
        nodes, filled_nodes = layout.to_nodes(observed.obs), layout.to_nodes(filled.obs)
        visible = layout.visible(nodes)
        assert torch.equal(filled_nodes[visible], nodes[visible])  # what an agent sees stays as it is
        assert torch.equal(filled.obs, reconstructer(observed.obs))
        assert not torch.equal(filled_nodes[~visible], nodes[~visible])  # the rest is filled in


def test_a_stage_of_ones_own_trains_on_two_ranks_and_hands_its_reconstructer_to_qmix(tmp_path):
    # tests/user_stage.py, importable from the working directory on every rank
    here = Path(__file__).parent
    mine = tmp_path / "mine"
    res = run_cli(["train", *COMMON, *GRAPH, "stage=user_stage:NodeFill", f"run_dir={mine}"], cwd=here)
    assert res.returncode == 0, res.stderr[-3000:]
    rows = read_metrics(mine)
    assert len(rows) == 2 and rows[-1]["val/mse"] < rows[0]["train/mse"]
    assert "trains fill" in res.stderr
    init = f"init_from={mine / 'checkpoints' / 'best.pt'}"
    res = run_cli(["train", *COMMON, *QMIX, "reconstruct=true", init, f"run_dir={tmp_path / 'q'}"], cwd=here)
    assert res.returncode == 0, res.stderr[-3000:]
    assert set(ckpt_of(tmp_path / "q")["state"]["reconstructer"]["networks"]) == {"fill"}


def test_the_oracle_acts_on_the_full_observation():
    from ddprl.algos.qmix.loop import make_env
    from ddprl.config import load_config
    from ddprl.envs.marl import make_marl_env

    cfg = load_config(["algo=qmix", "task=smax/3m", "full_obs=true"])
    raw = make_marl_env("smax/3m", 2, seed=5, full_obs=True)
    oracle = make_env(cfg, 2, seed=5, device="cpu")
    actions = torch.zeros(2, 3, dtype=torch.int64)
    for expected, seen in ((raw.reset(seed=5), oracle.reset(seed=5)), (raw.step(actions)[0], oracle.step(actions)[0])):
        assert torch.equal(seen.obs, expected.full) and not torch.equal(seen.obs, expected.obs)
