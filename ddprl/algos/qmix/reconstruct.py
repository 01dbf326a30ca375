"""The graph reconstructer: fills in the nodes of an observation that its agent cannot see.

An observation is cut into nodes (SELF, allies, enemies: :class:`~ddprl.envs.marl.graph.NodeLayout`).
Three stages train and use it (OMAGD's pipeline):

1. :class:`Tokenizer`, a VQ-VAE over single nodes: an MLP encodes a node, :class:`VectorQuantizer`
   snaps it to the nearest of K codes (an EMA codebook), an MLP decodes the code back to features.
2. :class:`MaskedTokenPredictor`, a transformer over one observation's node tokens: some tokens
   are replaced by MASK (:func:`mask_positions`) and it predicts the full-sight tokens there
   (:func:`typewise_hungarian_loss` or :func:`masked_cross_entropy`).
3. :class:`Reconstructer`, both frozen: the tokens of an observation's invisible nodes are
   predicted and decoded; visible nodes pass through unchanged.

    rec = Reconstructer(layout, tokenizer, predictor).eval()
    filled = rec(obs)                  # (..., O) -> (..., O)

Shapes: B batch, N nodes, W node width, K codes, D code width, M rows (nodes flattened).
Nothing here talks to other ranks: :meth:`VectorQuantizer.statistics` is local, the caller
sums it over ranks, and :meth:`VectorQuantizer.ema_update` applies the sum on every rank.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import nn
from torch.nn import functional as F

from ddprl.envs.marl.graph import NodeLayout, NodeType

# Rows per distance matrix in VectorQuantizer.nearest: (65,536 x 1,024) float32 is 256 MiB.
_NEAREST_CHUNK = 65536


class VQOut(NamedTuple):
    quantized: torch.Tensor  # (M, D) the codes' vectors, straight-through: gradients flow to z
    codes: torch.Tensor  # (M,) int64 the nearest code of each row
    loss: torch.Tensor  # () commitment loss: pulls z towards its code


class VectorQuantizer(nn.Module):
    """K codes of width D, moved by exponential moving averages of the rows assigned to them
    (van den Oord et al. 2017, appendix A.1), not by gradients.

    ``cluster_size`` (K,) and ``embed_sum`` (K, D) are the running count and sum of each code's
    rows; ``codebook = embed_sum / smoothed cluster_size``. They start at one row per code, the
    codebook itself, so that a code no row picks keeps its vector (a zero start would send it to
    the origin at the first update).

        vq = VectorQuantizer(num_codes=8, code_dim=4)
        out = vq(z)                                        # z (M, D)
        counts, sums = vq.statistics(z, out.codes)         # all-reduce both (sum) over ranks, then
        vq.ema_update(counts, sums)
    """

    def __init__(
        self, num_codes: int = 1024, code_dim: int = 32, decay: float = 0.9, commitment: float = 0.5, eps: float = 1e-5
    ):
        super().__init__()
        self.num_codes, self.code_dim = num_codes, code_dim
        self.decay, self.commitment, self.eps = decay, commitment, eps
        codebook = torch.randn(num_codes, code_dim) * 0.02  # OMAGD's scale
        self.register_buffer("codebook", codebook)
        self.register_buffer("cluster_size", torch.ones(num_codes))
        self.register_buffer("embed_sum", codebook.clone())

    @torch.no_grad()
    def nearest(self, z: torch.Tensor) -> torch.Tensor:
        """(M, D) -> (M,) int64: the code nearest each row in squared Euclidean distance (the
        first on ties), in float32 whatever z's dtype."""
        c = self.codebook.float()
        c2 = c.square().sum(-1)  # |z|^2 is the same for every code: it ranks nothing
        return torch.cat([(c2 - 2 * part.float() @ c.T).argmin(-1) for part in z.split(_NEAREST_CHUNK)])

    def lookup(self, codes: torch.Tensor) -> torch.Tensor:
        """(...) int64 -> (..., D): the codes' vectors."""
        return F.embedding(codes, self.codebook)

    def commitment_loss(self, z: torch.Tensor, q: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
        """``commitment * mean((z - q)^2)`` over the rows of (M, D) ``z`` where (M,) ``valid`` (all
        rows if None); only z gets gradients. 0 with no row."""
        sq = (z - q.detach()).square()
        if valid is None:
            return self.commitment * sq.sum() / max(sq.numel(), 1)
        return self.commitment * (sq * valid[:, None]).sum() / (valid.sum() * z.shape[-1]).clamp_min(1)

    def forward(self, z: torch.Tensor) -> VQOut:
        """(M, D) rows, all of them real -> :class:`VQOut`. Changes no state."""
        codes = self.nearest(z)
        q = self.lookup(codes)
        return VQOut(z + (q - z).detach(), codes, self.commitment_loss(z, q))

    @torch.no_grad()
    def statistics(self, z: torch.Tensor, codes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's rows per code: counts (K,) float32 and sums of z (K, D) float32. Sums over
        ranks add up to the statistics of the whole batch."""
        counts = torch.bincount(codes, minlength=self.num_codes).float()
        sums = torch.zeros(self.num_codes, self.code_dim, device=z.device).index_add_(0, codes, z.detach().float())
        return counts, sums

    @torch.no_grad()
    def ema_update(self, counts: torch.Tensor, sums: torch.Tensor) -> None:
        """One EMA step with the whole batch's ``statistics`` (summed over ranks): every rank that
        applies the same sums holds the same codebook. Laplace smoothing keeps an empty code's
        denominator above zero."""
        self.cluster_size.mul_(self.decay).add_(counts, alpha=1 - self.decay)
        self.embed_sum.mul_(self.decay).add_(sums, alpha=1 - self.decay)
        n = self.cluster_size.sum()
        smoothed = (self.cluster_size + self.eps) / (n + self.num_codes * self.eps) * n
        self.codebook.copy_(self.embed_sum / smoothed[:, None])

    def dead(self, threshold: float) -> torch.Tensor:
        """(K,) bool: the codes whose running count is below ``threshold`` rows per update."""
        return self.cluster_size < threshold

    @torch.no_grad()
    def revive(self, dead: torch.Tensor, candidates: torch.Tensor) -> None:
        """Give the i-th ``dead`` (K,) code the vector ``candidates[i % R]`` (R, D), with the
        running statistics of one row there (cluster_size 1, embed_sum the candidate): a batch's
        rows that pick it soon outweigh that one row, and without rows it stays at the
        candidate (up to Laplace smoothing) until it is found dead again. Live codes are untouched;
        the same candidates on every rank give the same codebook. No host sync."""
        if candidates.shape[0] == 0:
            raise ValueError("revive needs at least one candidate vector")
        slot = (dead.cumsum(0) - 1).clamp_min(0) % candidates.shape[0]  # (K,) the i of each dead code
        new = candidates.detach()[slot].to(self.codebook.dtype)
        self.codebook.copy_(torch.where(dead[:, None], new, self.codebook))
        self.embed_sum.copy_(torch.where(dead[:, None], new, self.embed_sum))
        self.cluster_size.masked_fill_(dead, 1.0)


def codebook_stats(counts: torch.Tensor) -> tuple[float, float]:
    """From (K,) counts summed over ranks: (perplexity ``exp(-sum p log p)``, the fraction of codes
    used). Perplexity is the number of codes in use when they are used equally. (0, 0) for no
    counts."""
    total = counts.sum()
    if total <= 0:
        return 0.0, 0.0
    p = counts.double() / total
    return math.exp(-torch.xlogy(p, p).sum().item()), (counts > 0).double().mean().item()


def _mlp(in_dim: int, hidden: int, out_dim: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Linear(in_dim, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, out_dim)
    )


class TokenizerOut(NamedTuple):
    recon: torch.Tensor  # (..., N, W) decoded nodes
    codes: torch.Tensor  # (..., N) int64 every node's code (invalid ones' too: ignore them)
    vq_loss: torch.Tensor  # () commitment loss over the valid nodes
    z: torch.Tensor  # (..., N, D) the encoder's output, for VectorQuantizer.statistics


class Tokenizer(nn.Module):
    """Stage 1: a VQ-VAE over single nodes. The encoder and decoder both read the node's type
    (one-hot), so one codebook serves SELF, allies and enemies.

        out = tok(nodes, types, valid)
        loss = reconstruction_error(out.recon, nodes, layout.feature_mask(), valid) + out.vq_loss
        counts, sums = tok.vq.statistics(out.z[valid], out.codes[valid])
    """

    def __init__(
        self,
        width: int,
        n_types: int = 3,
        hidden: int = 64,
        num_codes: int = 1024,
        code_dim: int = 32,
        decay: float = 0.9,
        commitment: float = 0.5,
    ):
        super().__init__()
        self.width, self.n_types = width, n_types
        self.encoder = _mlp(width + n_types, hidden, code_dim)
        self.vq = VectorQuantizer(num_codes, code_dim, decay, commitment)
        self.decoder = _mlp(code_dim + n_types, hidden, width)

    def _typed(self, x: torch.Tensor, types: torch.Tensor) -> torch.Tensor:
        """(..., N, F) -> (..., N, F + n_types): each node's features and its one-hot type."""
        onehot = F.one_hot(types, self.n_types).to(x.dtype)
        return torch.cat([x, onehot.expand(*x.shape[:-1], self.n_types)], dim=-1)

    def encode(self, nodes: torch.Tensor, types: torch.Tensor) -> torch.Tensor:
        """(..., N, W) nodes, (N,) types -> (..., N, D)."""
        return self.encoder(self._typed(nodes, types))

    def decode(self, q: torch.Tensor, types: torch.Tensor) -> torch.Tensor:
        """(..., N, D) code vectors, (N,) types -> (..., N, W)."""
        return self.decoder(self._typed(q, types))

    def forward(self, nodes: torch.Tensor, types: torch.Tensor, valid: torch.Tensor) -> TokenizerOut:
        """(..., N, W) nodes, (N,) types, (..., N) bool valid -> :class:`TokenizerOut`. Every node
        is quantized; only valid ones enter ``vq_loss`` (no host sync)."""
        z = self.encode(nodes, types)
        flat = z.reshape(-1, z.shape[-1])
        out = self.vq(flat)
        vq_loss = self.vq.commitment_loss(flat, self.vq.lookup(out.codes), valid.reshape(-1))
        recon = self.decode(out.quantized.view_as(z), types)
        return TokenizerOut(recon, out.codes.view(z.shape[:-1]), vq_loss, z)

    @torch.no_grad()
    def tokens(self, nodes: torch.Tensor, types: torch.Tensor) -> torch.Tensor:
        """(..., N, W) -> (..., N) int64: each node's code."""
        z = self.encode(nodes, types)
        return self.vq.nearest(z.reshape(-1, z.shape[-1])).view(z.shape[:-1])

    @torch.no_grad()
    def features(self, codes: torch.Tensor, types: torch.Tensor) -> torch.Tensor:
        """(..., N) int64 codes -> (..., N, W): the decoded code vectors."""
        return self.decode(self.vq.lookup(codes), types)


def reconstruction_error(
    recon: torch.Tensor, nodes: torch.Tensor, feature_mask: torch.Tensor, valid: torch.Tensor
) -> torch.Tensor:
    """Mean squared error of (..., N, W) ``recon`` against ``nodes`` over the real features
    ((N, W) ``feature_mask``) of the valid ((..., N)) nodes: padding and invalid nodes count for
    nothing. 0 with none."""
    real = feature_mask & valid[..., None]
    return ((recon - nodes).square() * real).sum() / real.sum().clamp_min(1)


class MaskedTokenPredictor(nn.Module):
    """Stage 2: a pre-norm transformer over one observation's N node tokens. Input per node: its
    token (or MASK, index K), its type and its position; output: logits over the K codes.
    Positions are learned because node k is always the same slot of the observation."""

    def __init__(
        self,
        num_codes: int,
        n_nodes: int,
        n_types: int = 3,
        d_model: int = 256,
        n_heads: int = 8,
        n_layers: int = 6,
        ffn_dim: int = 1024,
        dropout: float = 0.1,
    ):
        super().__init__()
        self.num_codes = num_codes
        self.token_embed = nn.Embedding(num_codes + 1, d_model)  # the last entry is MASK
        self.type_embed = nn.Embedding(n_types, d_model)  # not `type`: nn.Module.type is a method
        self.position = nn.Parameter(torch.randn(n_nodes, d_model))  # nn.Embedding's N(0, 1), as the others
        layer = nn.TransformerEncoderLayer(d_model, n_heads, ffn_dim, dropout, batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, n_layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, num_codes)

    def forward(self, tokens: torch.Tensor, masked: torch.Tensor, types: torch.Tensor) -> torch.Tensor:
        """(..., N) int64 tokens, (..., N) bool masked, (N,) types -> (..., N, K) logits. Masked
        tokens are read as MASK whatever they hold."""
        n = tokens.shape[-1]
        x = self.token_embed(tokens.reshape(-1, n).masked_fill(masked.reshape(-1, n), self.num_codes))
        x = x + self.type_embed(types) + self.position
        return self.head(self.norm(self.encoder(x))).view(*tokens.shape, self.num_codes)


def mask_positions(
    visible: torch.Tensor, types: torch.Tensor, ratio: float, generator: torch.Generator | None = None
) -> torch.Tensor:
    """(..., N) bool visible, (N,) types -> (..., N) bool: the nodes stage 2 masks in each row.
    Every invisible non-SELF node, then visible non-SELF nodes drawn at random until
    ``ceil(ratio * n)`` are masked (n: the non-SELF nodes), if the row has that many; SELF never.

    OMAGD's target is ``max(1, floor(ratio * N))`` with N counting SELF (at 0.15: 1 for SMAX 3m,
    as here; 1 for 5m_vs_6m, where this gives 2). Its unseen nodes are those present with full
    sight only, and it never masks a node whose full-sight token is a fixed "zero vector" code
    (a unit absent even with full sight); here such nodes are masked, so the predictor learns to
    tell dead from hidden: a caller that wants OMAGD's loss drops them from it."""
    is_other = types != NodeType.SELF
    target = math.ceil(ratio * int(is_other.sum()))
    other = is_other.expand_as(visible)
    hidden = ~visible & other
    need = (target - hidden.sum(-1, keepdim=True)).clamp_min(0)  # (B, 1)
    drawable = visible & other
    score = torch.rand(visible.shape, generator=generator, device=visible.device).masked_fill(~drawable, 2.0)
    rank = score.argsort(-1).argsort(-1)  # drawable nodes first, in random order
    return hidden | (drawable & (rank < need))


def masked_cross_entropy(logits: torch.Tensor, targets: torch.Tensor, masked: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of (B, N, K) ``logits`` against (B, N) ``targets`` over the ``masked``
    nodes; 0 (with a graph) when none is."""
    ce = F.cross_entropy(logits.flatten(0, -2).float(), targets.flatten(), reduction="none").view_as(targets)
    return (ce * masked).sum() / masked.sum().clamp_min(1)


def typewise_hungarian_loss(
    logits: torch.Tensor, targets: torch.Tensor, masked: torch.Tensor, types: torch.Tensor
) -> torch.Tensor:
    """Mean cross-entropy over the ``masked`` nodes, each scored against the target of a masked
    node of its own type in the same row, paired one-to-one to minimise the row's sum (Hungarian
    algorithm on the detached costs). Allies are interchangeable, as are enemies: the loss is
    the same for any order of their targets. 0 (with a graph) when nothing is masked.

    (B, N, K) logits, (B, N) int64 targets, (B, N) bool masked, (N,) types -> (); leading dims
    beyond B are flattened."""
    import numpy as np
    from scipy.optimize import linear_sum_assignment

    n = targets.shape[-1]
    targets, masked = targets.reshape(-1, n), masked.reshape(-1, n)  # leading dims flattened to B
    b = targets.shape[0]
    logp = logits.reshape(b, n, -1).float().log_softmax(-1)
    cost = -logp.gather(-1, targets[:, None, :].expand(b, n, n))  # [r, i, j]: CE of prediction i for target j
    match = torch.arange(n, device=targets.device).repeat(b, 1)  # (B, N): the target each node is scored against
    types_np, masked_np = types.cpu().numpy(), masked.cpu().numpy()
    match_np, cost_np = match.cpu().numpy(), None
    for t in np.unique(types_np):
        sel = masked_np & (types_np == t)  # (B, N)
        for r in np.flatnonzero(sel.sum(-1) > 1):  # a node alone of its type is its own match
            if cost_np is None:
                cost_np = cost.detach().cpu().numpy()
            pos = np.flatnonzero(sel[r])
            i, j = linear_sum_assignment(cost_np[r][np.ix_(pos, pos)])
            match_np[r, pos[i]] = pos[j]
    if cost_np is not None:
        match = torch.from_numpy(match_np).to(targets.device)
    picked = cost.gather(-1, match[..., None]).squeeze(-1)
    return (picked * masked).sum() / masked.sum().clamp_min(1)


class Reconstructer(nn.Module):
    """Stage 3's view of the stages before: an observation with its invisible nodes filled in.
    Visible nodes come back bit for bit; each invisible one is the decoded code the predictor
    ranks first for it. Gradients never flow (it is frozen); call ``.eval()`` (dropout)."""

    def __init__(self, layout: NodeLayout, tokenizer: Tokenizer, predictor: MaskedTokenPredictor):
        super().__init__()
        self.layout, self.tokenizer, self.predictor = layout, tokenizer, predictor
        self.register_buffer("types", layout.type_ids(), persistent=False)
        self.register_buffer("feature_mask", layout.feature_mask(), persistent=False)

    @torch.no_grad()
    def predict_nodes(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(..., O) -> (nodes (..., N, W) as observed, visible (..., N) bool, decoded (..., N, W):
        every node's predicted features, zero on padding)."""
        nodes = self.layout.to_nodes(obs)
        visible = self.layout.visible(nodes)
        logits = self.predictor(self.tokenizer.tokens(nodes, self.types), ~visible, self.types)
        decoded = self.tokenizer.features(logits.argmax(-1), self.types)
        return nodes, visible, decoded.masked_fill(~self.feature_mask, 0).to(obs.dtype)

    @torch.no_grad()
    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """(..., O) -> (..., O): visible nodes as observed, the others predicted."""
        nodes, visible, decoded = self.predict_nodes(obs)
        return self.layout.from_nodes(torch.where(visible[..., None], nodes, decoded))
