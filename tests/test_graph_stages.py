"""The graph stages' objectives and their learner (ddprl/algos/qmix/graph_stages.py, pretrain.py)
against values computed here: per-node errors, the tokenizer's loss and what it offers for
reviving dead codes, the predictor's token accuracy, and the optimizer step of a world of one."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from ddprl.algos.qmix.graph_stages import (
    MaskPredictorStage,
    NodeBatch,
    StageContext,
    StageLoss,
    TokenizerStage,
    node_squared_error,
)
from ddprl.algos.qmix.pretrain import StageLearner
from ddprl.config import load_config
from ddprl.envs.marl.graph import NodeLayout, NodeType

S, A, E = NodeType.SELF, NodeType.ALLY, NodeType.ENEMY
# SELF 4 features, an ally 3, two enemies 3: 4 nodes of width 4 (W 4 != D 3 != K 5 != N 4 * B)
LAYOUT = NodeLayout(obs_dim=13, types=(S, A, E, E), slices=((0, 4), (4, 7), (7, 10), (10, 13)))
KEYS = ["algo=qmix", "task=smax/3m", "num_codes=5", "code_dim=3", "node_hidden=8", "d_model=8", "n_heads=2"]
KEYS += ["n_layers=1", "ffn_dim=16", "dropout=0", "mask_ratio=0"]


def context(*more: str) -> StageContext:
    return StageContext(LAYOUT, load_config([*KEYS, *more]), torch.zeros(3, LAYOUT.width))


def nodes(batch: int, seed: int = 0) -> torch.Tensor:
    """(batch, 4, 4) nodes with their padding zero and some non-SELF nodes all zero (unseen)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, 4, 4, generator=g) * LAYOUT.feature_mask()
    x[:, 1:][torch.rand(batch, 3, generator=g) < 0.3] = 0
    return x


def test_node_squared_error_is_the_mean_over_each_nodes_own_features_by_hand():
    pred = torch.zeros(2, 4, 4)
    target = torch.zeros(2, 4, 4)
    target[0, 0] = torch.tensor([1.0, 2.0, 3.0, 4.0])  # SELF: 4 features, (1 + 4 + 9 + 16) / 4
    target[0, 1] = torch.tensor([3.0, 0.0, 0.0, 99.0])  # an ally: 3 features (99 is padding), 9 / 3
    pred[1, 2] = torch.tensor([1.0, 1.0, 2.0, 5.0])  # an enemy: (1 + 1 + 4) / 3
    error = node_squared_error(pred, target, LAYOUT.feature_mask())
    assert error.tolist() == [[7.5, 3.0, 0.0, 0.0], [0.0, 0.0, 2.0, 0.0]]


def test_tokenizer_loss_is_every_nodes_error_plus_the_commitment_and_counts_all_nodes():
    stage = TokenizerStage()
    modules = stage.build(context("revive_below=0"))
    tokenizer = modules["tokenizer"]
    x = nodes(6)
    out = stage.loss(tokenizer, modules, NodeBatch(x, x), torch.Generator())
    mine = tokenizer(x, LAYOUT.type_ids(), torch.ones(6, 4, dtype=torch.bool))
    per_node = torch.zeros(6, 4)
    for b in range(6):
        for k, (start, stop) in enumerate(LAYOUT.slices):
            w = stop - start
            per_node[b, k] = ((mine.recon[b, k, :w] - x[b, k, :w]) ** 2).mean()
    assert out.count.item() == 24
    assert out.loss_sum.item() == pytest.approx((per_node.sum() + 24 * mine.vq_loss).item(), rel=1e-5)
    seen = LAYOUT.visible(x)
    total, count = out.metrics["recon_mse"]
    assert count.item() == seen.sum().item() < 24  # units that exist only
    assert total.item() == pytest.approx(per_node[seen].sum().item(), rel=1e-5)
    total, count = out.metrics["vq_loss"]
    assert total.item() / count.item() == pytest.approx(mine.vq_loss.item(), rel=1e-5)
    assert out.statistics["code_counts"].sum().item() == 24 and out.samples == {}


def test_tokenizer_offers_revival_candidates_from_its_generator_only_while_a_code_is_dead():
    stage = TokenizerStage()
    modules = stage.build(context("revive_below=0.5"))
    tokenizer, x = modules["tokenizer"], nodes(6)
    vq = tokenizer.vq
    vq.cluster_size.fill_(1.0)  # none dead
    assert stage.loss(tokenizer, modules, NodeBatch(x, x), torch.Generator()).samples == {}
    vq.cluster_size[2] = 0.1  # one dead (and far from every row): candidates for every code, rows of z
    vq.codebook[2] = 100.0
    torch.manual_seed(123)  # the global stream must not matter
    out = stage.loss(tokenizer, modules, NodeBatch(x, x), torch.Generator().manual_seed(9))
    z = tokenizer.encode(x, LAYOUT.type_ids()).reshape(24, 3).detach()
    pick = torch.randint(0, 24, (5,), generator=torch.Generator().manual_seed(9))
    assert torch.equal(out.samples["candidates"], z[pick])
    stage.after_step(modules, out.statistics, out.samples)  # still dead after the EMA: onto the first candidate
    assert torch.equal(vq.codebook[2], out.samples["candidates"][0]) and vq.cluster_size[2].item() == 1.0


def test_mask_predictor_counts_the_tokens_it_gets_right_over_masked_and_missing_nodes():
    stage = MaskPredictorStage()
    modules = stage.build(context())
    tokenizer = modules["tokenizer"]
    full = nodes(4, seed=1)
    full[:, 1:] = torch.where(LAYOUT.visible(full)[:, 1:, None], full[:, 1:], 1.0) * LAYOUT.feature_mask()[1:]
    partial = full.clone()
    partial[:, 2:] = 0  # both enemies unseen, present with full sight: missing
    targets = tokenizer.tokens(full, LAYOUT.type_ids())
    logits = torch.zeros(4, 4, 5)
    logits[:, :, 0] = 1.0  # predicts code 0 everywhere but the first row's nodes
    logits[0] = torch.nn.functional.one_hot(targets[0], 5).float() * 5
    out = stage.loss(lambda tokens, masked, types: logits, modules, NodeBatch(partial, full), torch.Generator())
    right = (targets[:, 2:] == 0).float()
    right[0] = 1.0
    total, count = out.metrics["missing_token_accuracy"]
    assert (total.item(), count.item()) == (right.sum().item(), 8)
    assert out.count.item() == 8  # mask_ratio 0: the unseen nodes only


class WorldOfOne:
    """The runtime StageLearner calls, for one process without a process group."""

    world_size, device = 1, torch.device("cpu")

    @staticmethod
    def wrap(module, compile=False):
        return module

    @staticmethod
    def all_reduce_sum(value):
        return value

    @staticmethod
    def all_gather(value):
        return value


class LinearStage:
    """A stage whose loss is the summed squared error of a linear map over the batch's nodes."""

    trains, takes = "lin", ()

    def loss(self, model, modules, batch, generator):
        err = ((model(batch.partial) - batch.full) ** 2).sum(-1)  # (B, N)
        count = torch.tensor(float(err.numel()))
        return StageLoss(err.sum(), count, {})

    def after_step(self, modules, statistics, samples):
        pass


@pytest.mark.parametrize("max_grad_norm", [0.0, 0.05])
def test_the_learner_steps_adam_on_the_mean_loss_and_reports_the_gradient_norm(max_grad_norm):
    torch.manual_seed(0)
    lin = nn.Linear(4, 4)
    reference = copy.deepcopy(lin)
    learner = StageLearner(WorldOfOne(), LinearStage(), {"lin": lin}, lr=0.01, max_grad_norm=max_grad_norm)
    adam = torch.optim.Adam(reference.parameters(), lr=0.01)
    for scale, seed in ((1.0, 1), (30.0, 2)):  # two batches of very different gradients: the clip shows
        x, y = nodes(8, seed), nodes(8, seed + 10) * scale
        out = learner.update(NodeBatch(x, y), torch.Generator())
        loss = ((reference(x) - y) ** 2).sum(-1).mean()  # the mean over the batch's nodes
        loss.backward()
        norm = torch.cat([p.grad.flatten() for p in reference.parameters()]).norm()
        assert out.metrics["grad_norm"][0].item() == pytest.approx(norm.item(), rel=1e-5)
        if max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(reference.parameters(), max_grad_norm)
        adam.step()
        adam.zero_grad()
    for mine, theirs in zip(lin.parameters(), reference.parameters(), strict=True):
        assert torch.allclose(mine, theirs, atol=1e-6)


def test_a_batch_with_nothing_to_learn_from_leaves_the_module_as_it_was():
    class Empty(LinearStage):
        def loss(self, model, modules, batch, generator):
            return StageLoss((model(batch.partial) * 0).sum(), torch.tensor(0.0), {})

    lin = nn.Linear(4, 4)
    before = copy.deepcopy(lin.state_dict())
    StageLearner(WorldOfOne(), Empty(), {"lin": lin}, lr=0.01, max_grad_norm=0).update(
        NodeBatch(nodes(2), nodes(2)), torch.Generator()
    )
    for k, v in lin.state_dict().items():
        assert torch.equal(v, before[k]), k  # no NaN from 0 / 0
