"""The stages that pretrain a graph reconstructer for QMIX, and the interface they share.

A stage trains one module on observations of random play, data-parallel: each rank plays its
own episodes, DDP wraps only the module being trained, the objective is a global mean (summed
over ranks, divided by the global count), and state outside the gradient (a codebook's EMA) is
updated from statistics summed over ranks, so every rank holds the same module. The loop
(``ddprl.algos.qmix.pretrain``) runs any :class:`Stage`:

- ``stage=tokenizer`` (:class:`TokenizerStage`): a VQ-VAE over the nodes of the full
  observation (every unit, unlimited sight); hands on the tokenizer.
- ``stage=mask_predictor`` (:class:`MaskPredictorStage`): the tokenizer frozen, a transformer
  over the tokens of the sight-limited observation predicts the full observation's tokens where
  nodes are masked; hands on the :class:`~ddprl.algos.qmix.reconstruct.Reconstructer` that
  ``stage=qmix reconstruct=true`` puts before the agent network.

A stage of one's own is a class with the attributes and methods of :class:`Stage`, named on
the command line as ``stage=package.module:ClassName`` (importable on every rank); see
docs/qmix.md, "Staged training".
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, NamedTuple, Protocol

import torch
from torch import Tensor, nn

from ddprl.algos.qmix.config import is_graph_stage
from ddprl.algos.qmix.reconstruct import (
    MaskedTokenPredictor,
    Reconstructer,
    Tokenizer,
    TokenizerOut,
    codebook_stats,
    mask_positions,
    masked_cross_entropy,
    typewise_hungarian_loss,
)
from ddprl.envs.marl.graph import NodeLayout, NodeType
from ddprl.errors import UsageError


class NodeBatch(NamedTuple):
    """Observations of single agents at single steps, cut into nodes (B samples, N nodes, W width)."""

    partial: Tensor  # (B, N, W) what the agent sees (out-of-sight units all zero)
    full: Tensor  # (B, N, W) the same moment with unlimited sight


class StageLoss(NamedTuple):
    """What a stage's step computed on this rank's batch.

    ``loss_sum`` is the objective summed over what it averages (``count`` of them): the loop
    divides it by the count summed over ranks, so N ranks take the step one process takes on
    their batches together. ``metrics``: name -> (sum, count) on this batch, detached.
    ``statistics``: sums over this batch for :meth:`Stage.after_step` (summed over ranks first);
    ``samples``: tensors gathered from every rank for it (the same shape on each rank).
    """

    loss_sum: Tensor
    count: Tensor
    metrics: dict[str, tuple[Tensor, Tensor]]
    statistics: dict[str, Tensor] = {}
    samples: dict[str, Tensor] = {}


@dataclass(frozen=True)
class StageContext:
    """What a stage is built for: the env's node layout, the job's keys, and statistics of the
    collected data (every rank's)."""

    layout: NodeLayout
    cfg: Any  # QMIXConfig: the stage reads the keys it needs
    type_means: Tensor  # (3, W) mean full-observation features of seen nodes of each NodeType


class Stage(Protocol):
    """One pretraining stage: what it trains, on what, and what it hands on."""

    trains: str  # the name of the module it trains (the one DDP wraps)
    takes: tuple[str, ...]  # modules it needs from init_from (kept frozen), by name

    def build(self, ctx: StageContext) -> dict[str, nn.Module]:
        """Every module of the stage, fresh: the one it trains and those it ``takes``."""
        ...

    def loss(
        self, model: nn.Module, modules: dict[str, nn.Module], batch: NodeBatch, generator: torch.Generator
    ) -> StageLoss:
        """The objective on this rank's ``batch``; ``model`` is the trained module as wrapped for
        training (call it for the forward), ``modules`` the plain ones by name."""
        ...

    def after_step(self, modules: dict[str, nn.Module], statistics: dict[str, Tensor], samples: dict[str, Tensor]):
        """After the optimizer step: update state outside the gradient from ``statistics`` (summed
        over ranks) and ``samples`` (gathered from every rank); the same on every rank."""
        ...

    def evaluate(self, modules: dict[str, nn.Module], batch: NodeBatch, generator: torch.Generator) -> StageLoss:
        """Validation metrics on ``batch`` (no gradient; ``loss_sum`` is logged as val/loss)."""
        ...

    def reconstructer(self, modules: dict[str, nn.Module], layout: NodeLayout) -> nn.Module | None:
        """The module stage qmix puts before the agent network (observation -> observation), or None."""
        ...


def _type_ids(layout: NodeLayout, like: Tensor) -> Tensor:
    return layout.type_ids(like.device)


def _sum_count(values: Tensor, where: Tensor) -> tuple[Tensor, Tensor]:
    """(sum of ``values`` where ``where``, count), detached: a metric's share of this batch."""
    where = where.expand_as(values)
    return (values * where).sum().detach(), where.sum().to(values.dtype)


def node_squared_error(pred: Tensor, target: Tensor, feature_mask: Tensor) -> Tensor:
    """(..., N, W) -> (..., N): the mean squared error over each node's real features."""
    mask = feature_mask.to(pred.dtype)
    return ((pred - target) ** 2 * mask).sum(-1) / mask.sum(-1)


class TokenizerStage:
    """Stage 1: a VQ-VAE over nodes (:class:`~ddprl.algos.qmix.reconstruct.Tokenizer`).

    It learns every node of the full observation, the all-zero ones (dead units) too: stage 3
    decodes the predicted tokens of unseen nodes, and a dead unit must decode to zeros.
    Objective per node: the squared error over its real features plus the commitment loss.
    """

    trains = "tokenizer"
    takes: tuple[str, ...] = ()

    def build(self, ctx: StageContext) -> dict[str, nn.Module]:
        c = ctx.cfg
        tokenizer = Tokenizer(
            ctx.layout.width,
            len(NodeType),
            c.node_hidden,
            c.num_codes,
            c.code_dim,
            decay=c.codebook_decay,
            commitment=c.commitment,
        )
        self.layout, self.revive_below = ctx.layout, c.revive_below
        return {"tokenizer": tokenizer}

    def _reconstruct(self, tokenizer: nn.Module, nodes: Tensor) -> tuple[TokenizerOut, Tensor, Tensor, Tensor]:
        """Every node through ``tokenizer``: its output, the error per node, the objective
        (summed over nodes) and the node count."""
        valid = torch.ones(nodes.shape[:-1], dtype=torch.bool, device=nodes.device)
        out = tokenizer(nodes, _type_ids(self.layout, nodes), valid)
        per_node = node_squared_error(out.recon, nodes, self.layout.feature_mask(nodes.device))
        count = torch.tensor(float(per_node.numel()), device=nodes.device)
        return out, per_node, per_node.sum() + out.vq_loss * count, count

    def loss(
        self, model: nn.Module, modules: dict[str, nn.Module], batch: NodeBatch, generator: torch.Generator
    ) -> StageLoss:
        nodes = batch.full
        out, per_node, loss_sum, count = self._reconstruct(model, nodes)
        seen = self.layout.visible(nodes)
        vq = modules["tokenizer"].vq
        z = out.z.reshape(-1, out.z.shape[-1]).detach()
        codes = out.codes.reshape(-1)
        counts, sums = vq.statistics(z, codes)
        samples = {}
        # Dead codes are the same on every rank (the same statistics): every rank offers candidates or none.
        if self.revive_below > 0 and bool(vq.dead(self.revive_below).any()):
            pick = torch.randint(0, z.shape[0], (vq.codebook.shape[0],), generator=generator, device=z.device)
            samples["candidates"] = z[pick]
        return StageLoss(
            loss_sum=loss_sum,
            count=count,
            metrics={
                "recon_mse": _sum_count(per_node, seen),  # units that exist (zeros are easy)
                "vq_loss": (out.vq_loss.detach() * count, count),
            },
            statistics={"code_counts": counts, "code_sums": sums},
            samples=samples,
        )

    def after_step(
        self, modules: dict[str, nn.Module], statistics: dict[str, Tensor], samples: dict[str, Tensor]
    ) -> None:
        vq = modules["tokenizer"].vq
        vq.ema_update(statistics["code_counts"], statistics["code_sums"])
        if "candidates" in samples:  # codes unused for a while move onto encoder outputs of all ranks
            vq.revive(vq.dead(self.revive_below), samples["candidates"])

    @torch.no_grad()
    def evaluate(self, modules: dict[str, nn.Module], batch: NodeBatch, generator: torch.Generator) -> StageLoss:
        tokenizer = modules["tokenizer"]
        nodes = batch.full
        out, per_node, loss_sum, count = self._reconstruct(tokenizer, nodes)
        counts = torch.bincount(out.codes.reshape(-1), minlength=tokenizer.vq.codebook.shape[0]).float()
        return StageLoss(
            loss_sum=loss_sum,
            count=count,
            metrics={"recon_mse": _sum_count(per_node, self.layout.visible(nodes))},
            statistics={"code_counts": counts},
        )

    def reconstructer(self, modules: dict[str, nn.Module], layout: NodeLayout) -> nn.Module | None:
        return None


def codebook_metrics(counts: Tensor) -> dict[str, float]:
    """Perplexity and the fraction of codes in use, from code counts summed over ranks."""
    perplexity, usage = codebook_stats(counts)
    return {"perplexity": perplexity, "codebook_usage": usage}


class MaskPredictorStage:
    """Stage 2: the tokenizer frozen, a :class:`~ddprl.algos.qmix.reconstruct.MaskedTokenPredictor`
    learns the full observation's tokens at masked nodes from the sight-limited observation's.

    Masked: every unseen non-SELF node (an agent cannot tell a dead unit from one out of sight,
    so acting masks them all and so does training; a dead unit's target is the zero node's
    token), then random seen nodes up to ``mask_ratio``. Metrics on the *missing* nodes (unseen
    but present in the full observation): token accuracy and the decoded features' error,
    beside two baselines computed the same way: predicting nothing (the zeros the agent sees)
    and predicting each node type's mean features.
    """

    trains = "predictor"
    takes: tuple[str, ...] = ("tokenizer",)

    def build(self, ctx: StageContext) -> dict[str, nn.Module]:
        c = ctx.cfg
        self.layout, self.mask_ratio, self.hungarian = ctx.layout, c.mask_ratio, c.mask_loss == "hungarian"
        self.type_means = ctx.type_means
        tokenizer = TokenizerStage().build(ctx)["tokenizer"]
        predictor = MaskedTokenPredictor(
            c.num_codes, ctx.layout.n_nodes, len(NodeType), c.d_model, c.n_heads, c.n_layers, c.ffn_dim, c.dropout
        )
        return {"tokenizer": tokenizer, "predictor": predictor}

    def _inputs(self, tokenizer: nn.Module, batch: NodeBatch, generator: torch.Generator):
        types = _type_ids(self.layout, batch.partial)
        tokens = tokenizer.tokens(batch.partial, types)
        targets = tokenizer.tokens(batch.full, types)
        seen = self.layout.visible(batch.partial)
        masked = mask_positions(seen, types, self.mask_ratio, generator)
        missing = ~seen & self.layout.visible(batch.full)
        return types, tokens, targets, masked, missing

    def _objective(self, logits: Tensor, targets: Tensor, masked: Tensor, types: Tensor) -> tuple[Tensor, Tensor]:
        count = masked.sum().float()
        if self.hungarian:
            mean = typewise_hungarian_loss(logits, targets, masked, types)
        else:
            mean = masked_cross_entropy(logits, targets, masked)
        return mean * count, count

    def loss(
        self, model: nn.Module, modules: dict[str, nn.Module], batch: NodeBatch, generator: torch.Generator
    ) -> StageLoss:
        types, tokens, targets, masked, missing = self._inputs(modules["tokenizer"], batch, generator)
        logits = model(tokens, masked, types)
        loss_sum, count = self._objective(logits.float(), targets, masked, types)
        right = (logits.detach().argmax(-1) == targets).float()
        return StageLoss(
            loss_sum,
            count,
            {"token_accuracy": _sum_count(right, masked), "missing_token_accuracy": _sum_count(right, missing)},
        )

    def after_step(
        self, modules: dict[str, nn.Module], statistics: dict[str, Tensor], samples: dict[str, Tensor]
    ) -> None:
        pass

    @torch.no_grad()
    def evaluate(self, modules: dict[str, nn.Module], batch: NodeBatch, generator: torch.Generator) -> StageLoss:
        tokenizer, predictor = modules["tokenizer"], modules["predictor"]
        types, tokens, targets, masked, missing = self._inputs(tokenizer, batch, generator)
        logits = predictor(tokens, masked, types).float()
        loss_sum, count = self._objective(logits, targets, masked, types)
        fmask = self.layout.feature_mask(batch.full.device)
        predicted = logits.argmax(-1)
        decoded = tokenizer.features(predicted, types) * fmask
        means = self.type_means.to(batch.full)[types].expand_as(batch.full)
        mean_tokens = tokenizer.tokens(means, types)
        metrics = {
            "token_accuracy": _sum_count((predicted == targets).float(), masked),
            "missing_token_accuracy": _sum_count((predicted == targets).float(), missing),
            "missing_token_accuracy_nothing": _sum_count((tokens == targets).float(), missing),
            "missing_token_accuracy_type_mean": _sum_count((mean_tokens == targets).float(), missing),
            "missing_feature_mse": _sum_count(node_squared_error(decoded, batch.full, fmask), missing),
            "missing_feature_mse_nothing": _sum_count(node_squared_error(batch.partial, batch.full, fmask), missing),
            "missing_feature_mse_type_mean": _sum_count(node_squared_error(means, batch.full, fmask), missing),
            # the tokenizer's own error on those nodes: what perfect token predictions would reach
            "missing_feature_mse_true_tokens": _sum_count(
                node_squared_error(tokenizer.features(targets, types) * fmask, batch.full, fmask), missing
            ),
        }
        return StageLoss(loss_sum, count, metrics)

    def reconstructer(self, modules: dict[str, nn.Module], layout: NodeLayout) -> nn.Module | None:
        return Reconstructer(layout, modules["tokenizer"], modules["predictor"])


BUILT_IN: dict[str, type] = {"tokenizer": TokenizerStage, "mask_predictor": MaskPredictorStage}


def stage_named(name: str) -> Stage:
    """The stage ``name`` names: a built-in one, or ``package.module:ClassName`` (a user's)."""
    if name in BUILT_IN:
        return BUILT_IN[name]()
    module_name, _, class_name = name.partition(":")
    if not class_name:
        raise UsageError(f"stage={name!r} is not one of qmix, {', '.join(BUILT_IN)}, pretrain or package.module:Class")
    try:
        cls = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError) as e:
        raise UsageError(f"stage={name}: cannot load it ({e})") from None
    missing = [
        a
        for a in ("trains", "takes", "build", "loss", "after_step", "evaluate", "reconstructer")
        if not hasattr(cls, a)
    ]
    if missing:
        raise UsageError(
            f"stage={name}: {class_name} lacks {', '.join(missing)} (see ddprl.algos.qmix.graph_stages.Stage)"
        )
    return cls()


def reconstructer_state(ckpt: dict[str, Any]) -> dict[str, Any]:
    """What stage qmix keeps of a graph stage's checkpoint to rebuild its reconstructer (saved
    with stage qmix's own checkpoints, so that they evaluate without the file)."""
    state = ckpt["state"]
    return {"config": ckpt["config"], "networks": state["networks"], "type_means": state["type_means"]}


def build_reconstructer(saved: dict[str, Any], layout: NodeLayout, source: str) -> nn.Module:
    """The frozen reconstructer of a graph stage's checkpoint (:func:`reconstructer_state`)."""
    keys = SimpleNamespace(**saved["config"])
    stage = stage_named(keys.stage) if is_graph_stage(keys.stage) else None
    if stage is None:
        raise UsageError(
            f"{source} is a stage={keys.stage} checkpoint: reconstruct=true needs a stage=mask_predictor one"
        )
    modules = stage.build(StageContext(layout, keys, saved["type_means"]))
    for name, module in modules.items():
        try:
            module.load_state_dict(saved["networks"][name])
        except (KeyError, RuntimeError) as e:
            raise UsageError(f"{source}: its {name} does not fit this task ({str(e).splitlines()[0][:160]})") from None
    reconstructer = stage.reconstructer(modules, layout)
    if reconstructer is None:
        raise UsageError(
            f"{source} is a stage={keys.stage} checkpoint, which hands on no reconstructer: give a "
            "stage=mask_predictor checkpoint"
        )
    return reconstructer.requires_grad_(False).eval()
