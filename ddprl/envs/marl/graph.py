"""An agent's observation seen as a graph: one node per unit (itself, its allies, its enemies).

A unit-list observation (SMAC's and SMAX's layout) is a concatenation of blocks, one per unit;
a block is all zeros where its unit is out of sight or dead. :class:`NodeLayout` cuts such a
vector into ``n_nodes`` nodes of one padded ``width`` and puts them back, exactly:

    nodes = layout.to_nodes(obs)        # (..., O) -> (..., n_nodes, width), zero-padded
    obs = layout.from_nodes(nodes)      # the inverse on the valid features
    seen = layout.visible(nodes)        # (..., n_nodes) bool; SELF always True

Nodes come SELF first, then allies, then enemies, each team in the env's order.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from enum import IntEnum

import torch


class NodeType(IntEnum):
    SELF = 0
    ALLY = 1
    ENEMY = 2


@dataclass(frozen=True)
class NodeLayout:
    """How to cut an ``obs_dim`` observation vector into nodes: node ``k`` has type ``types[k]``
    and features ``obs[slices[k][0]:slices[k][1]]``; the slices tile ``[0, obs_dim)``."""

    obs_dim: int
    types: tuple[NodeType, ...]
    slices: tuple[tuple[int, int], ...]

    def __post_init__(self) -> None:
        if len(self.types) != len(self.slices) or not self.slices:
            raise ValueError(f"{len(self.types)} node types for {len(self.slices)} slices")
        covered = sorted(i for start, stop in self.slices for i in range(start, stop))
        if covered != list(range(self.obs_dim)) or any(stop <= start for start, stop in self.slices):
            raise ValueError(f"the node slices {self.slices} do not tile an observation of {self.obs_dim}")
        object.__setattr__(self, "types", tuple(NodeType(t) for t in self.types))

    @property
    def n_nodes(self) -> int:
        return len(self.slices)

    @property
    def width(self) -> int:
        """The padded feature width of a node: the widest block."""
        return max(stop - start for start, stop in self.slices)

    def type_ids(self, device: torch.device | str = "cpu") -> torch.Tensor:
        """(n_nodes,) int64: each node's :class:`NodeType`."""
        return torch.tensor([int(t) for t in self.types], dtype=torch.int64, device=device)

    def feature_mask(self, device: torch.device | str = "cpu") -> torch.Tensor:
        """(n_nodes, width) bool: True on a node's own features, False on its padding."""
        return _indices(self, torch.device(device))[1]

    def to_nodes(self, obs: torch.Tensor) -> torch.Tensor:
        """(..., obs_dim) -> (..., n_nodes, width), each node's block zero-padded to ``width``."""
        gather, mask, _ = _indices(self, obs.device)
        return torch.where(mask, obs[..., gather], torch.zeros((), dtype=obs.dtype, device=obs.device))

    def from_nodes(self, nodes: torch.Tensor) -> torch.Tensor:
        """(..., n_nodes, width) -> (..., obs_dim): the inverse of :meth:`to_nodes` (padding dropped)."""
        return nodes.flatten(-2)[..., _indices(self, nodes.device)[2]]

    def visible(self, nodes: torch.Tensor) -> torch.Tensor:
        """(..., n_nodes, width) -> (..., n_nodes) bool: the node's block is not all zeros (an
        unseen or dead unit's is); SELF counts as visible whatever its features."""
        is_self = self.type_ids(nodes.device) == NodeType.SELF
        return (nodes != 0).any(-1) | is_self


@functools.lru_cache(maxsize=64)
def _indices(layout: NodeLayout, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per layout and device: where each node feature comes from in the observation (n_nodes,
    width), which of them are real features (n_nodes, width), and where each observation feature
    sits in the flattened nodes (obs_dim,)."""
    width = layout.width
    offsets = torch.arange(width)
    starts = torch.tensor([start for start, _ in layout.slices])
    sizes = torch.tensor([stop - start for start, stop in layout.slices])
    mask = offsets < sizes[:, None]
    gather = torch.where(mask, starts[:, None] + offsets, 0)
    inverse = torch.empty(layout.obs_dim, dtype=torch.int64)
    flat = torch.arange(layout.n_nodes * width).view(layout.n_nodes, width)
    inverse[gather[mask]] = flat[mask]
    return gather.to(device), mask.to(device), inverse.to(device)
