"""The graph reconstructer's stages under DDP (2 gloo ranks) equal one process on the whole
batch: the tokenizer's weights and its codebook (EMA statistics summed over ranks), the mask
predictor's weights, and the gradient itself, update by update."""

from __future__ import annotations

import functools

import dist_fns
import pytest
import torch

from ddprl.config import load_config
from ddprl.envs.marl.graph import NodeType
from ddprl.runtime import launch

TYPES = (NodeType.SELF, NodeType.ALLY, NodeType.ENEMY, NodeType.ENEMY)
SLICES = ((0, 4), (4, 7), (7, 10), (10, 13))
STEPS, BATCH = 3, 16


def node_batches(g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """STEPS batches of BATCH observations as nodes (N 4, W 4): the full ones, and the partial
    ones with about half the non-SELF nodes out of sight (all zero)."""
    full = torch.randn(STEPS, BATCH, len(TYPES), 4, generator=g)
    full[..., 1:, 3] = 0  # padding: allies and enemies have 3 features
    unseen = torch.rand(STEPS, BATCH, len(TYPES), generator=g) < 0.5
    unseen[..., 0] = False
    return full.masked_fill(unseen[..., None], 0.0), full


@pytest.fixture(scope="module")
def data_path(tmp_path_factory):
    partial, full = node_batches(torch.Generator().manual_seed(5))
    path = tmp_path_factory.mktemp("graph") / "nodes.pt"
    torch.save({"layout": (13, tuple(int(t) for t in TYPES), SLICES), "partial": partial, "full": full}, path)
    return str(path)


def run(tmp_path, data_path, stage, world_size):
    cfg = load_config(
        [
            "algo=qmix",
            "task=smax/3m",
            f"stage={stage}",
            f"world_size={world_size}",
            f"num_envs={world_size}",
            "dist_timeout=60",
            "lr=0.01",
            "num_codes=8",
            "code_dim=4",
            "node_hidden=8",
            "revive_below=0",  # revival draws candidates per rank: its own test in test_reconstruct.py
            "d_model=8",
            "n_heads=2",
            "n_layers=1",
            "ffn_dim=16",
            "dropout=0",
            "mask_ratio=0",  # only the unseen nodes: no random draw that differs between the runs
        ]
    )
    out = tmp_path / f"{stage}-w{world_size}"
    out.mkdir()
    launch(functools.partial(dist_fns.graph_stage_learn, out=str(out), data_path=data_path, steps=STEPS), cfg)
    return [torch.load(out / f"rank{r}.pt") for r in range(world_size)]


@pytest.mark.parametrize("stage, trained", [("tokenizer", "tokenizer"), ("mask_predictor", "predictor")])
def test_two_half_batches_equal_one_process_on_the_whole_batch(tmp_path, data_path, stage, trained):
    single = run(tmp_path, data_path, stage, 1)[0]
    ddp = run(tmp_path, data_path, stage, 2)
    # the averaged gradient, update by update: a sum over ranks for a mean would double it
    assert min(single["norms"]) > 1e-3
    for r in ddp:
        assert r["norms"] == pytest.approx(single["norms"], rel=1e-5)
    for name, params in single["state"].items():
        for k, v in params.items():
            assert torch.equal(ddp[0]["state"][name][k], ddp[1]["state"][name][k]), (name, k)
            got = ddp[0]["state"][name][k]
            if k.endswith("self_attn.in_proj_bias"):
                # The key bias's gradient is zero in exact arithmetic (softmax ignores a constant
                # added to every score of a query), so Adam turns rounding noise into steps there.
                d = v.shape[0] // 3
                v, got = torch.cat([v[:d], v[2 * d :]]), torch.cat([got[:d], got[2 * d :]])
            assert torch.allclose(got, v, atol=1e-5), (name, k)
    if stage == "tokenizer":  # the codebook moved, by the statistics of both ranks' halves
        assert not torch.allclose(single["state"]["tokenizer"]["vq.codebook"], _fresh_codebook(), atol=1e-4)
    else:  # the frozen tokenizer is exactly as built
        fresh = _fresh_modules("mask_predictor")["tokenizer"].state_dict()
        for k, v in fresh.items():
            assert torch.equal(single["state"]["tokenizer"][k], v), k
    assert trained in single["state"]


def _fresh_modules(stage):
    from ddprl.algos.qmix.graph_stages import StageContext, stage_named
    from ddprl.envs.marl.graph import NodeLayout

    cfg = load_config(
        ["algo=qmix", "task=smax/3m", "num_codes=8", "code_dim=4", "node_hidden=8", "d_model=8", "n_heads=2"]
        + ["n_layers=1", "ffn_dim=16"]
    )
    torch.manual_seed(0)
    return stage_named(stage).build(StageContext(NodeLayout(13, TYPES, SLICES), cfg, torch.zeros(3, 4)))


def _fresh_codebook():
    return _fresh_modules("tokenizer")["tokenizer"].vq.codebook
