"""A user's own graph stage, the example of docs/qmix.md ("Staged training"): an MLP that fills in each node of the
full observation from the whole sight-limited one (``stage=user_stage:NodeFill``)."""

from __future__ import annotations

import torch
from torch import nn

from ddprl.algos.qmix.graph_stages import StageLoss


class Fill(nn.Module):
    def __init__(self, n_nodes: int, width: int):
        super().__init__()
        self.net = nn.Sequential(
            nn.Flatten(-2), nn.Linear(n_nodes * width, 32), nn.ReLU(), nn.Linear(32, n_nodes * width)
        )

    def forward(self, nodes: torch.Tensor) -> torch.Tensor:
        return self.net(nodes).view(nodes.shape)


class Reconstruct(nn.Module):
    """Observation -> observation: unseen nodes from the MLP, seen ones as observed."""

    def __init__(self, fill: nn.Module, layout):
        super().__init__()
        self.fill, self.layout = fill, layout

    @torch.no_grad()
    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        nodes = self.layout.to_nodes(obs)
        seen = self.layout.visible(nodes)[..., None]
        filled = self.fill(nodes) * self.layout.feature_mask(obs.device)
        return self.layout.from_nodes(torch.where(seen, nodes, filled))


class NodeFill:
    trains = "fill"
    takes: tuple[str, ...] = ()

    def build(self, ctx):
        n, w = ctx.layout.n_nodes, ctx.layout.width
        return {
            "fill": nn.Sequential(
                nn.Flatten(-2), nn.Linear(n * w, 32), nn.ReLU(), nn.Linear(32, n * w), nn.Unflatten(-1, (n, w))
            )
        }

    def loss(self, model, modules, batch, generator):
        err = ((model(batch.partial) - batch.full) ** 2).mean(-1)  # (B, nodes)
        count = torch.tensor(float(err.numel()))
        return StageLoss(err.sum(), count, {"mse": (err.sum().detach(), count)})

    def after_step(self, modules, statistics, samples):
        pass

    @torch.no_grad()
    def evaluate(self, modules, batch, generator):
        return self.loss(modules["fill"], modules, batch, generator)

    def reconstructer(self, modules, layout):
        return Reconstruct(modules["fill"], layout)
