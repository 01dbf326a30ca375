"""The graph reconstructer's pieces (ddprl/algos/qmix/reconstruct.py) against hand-computed values:
the EMA codebook and its revival, the tokenizer's losses, the masking rule, the type-wise
Hungarian loss against brute force, and the frozen Reconstructer."""

from __future__ import annotations

import copy
import itertools
import math

import pytest
import torch

from ddprl.algos.qmix.reconstruct import (
    MaskedTokenPredictor,
    Reconstructer,
    Tokenizer,
    VectorQuantizer,
    codebook_stats,
    mask_positions,
    masked_cross_entropy,
    reconstruction_error,
    typewise_hungarian_loss,
)
from ddprl.envs.marl.graph import NodeLayout, NodeType

S, A, E = NodeType.SELF, NodeType.ALLY, NodeType.ENEMY
# SELF 3 features, 2 allies x 2, 2 enemies x 3: 13 features, 5 nodes of width 3
LAYOUT = NodeLayout(obs_dim=13, types=(S, A, A, E, E), slices=((0, 3), (3, 5), (5, 7), (7, 10), (10, 13)))


def small_vq(codebook: list[list[float]], eps: float = 1e-5, commitment: float = 0.5) -> VectorQuantizer:
    """A quantizer holding ``codebook``, with the statistics of one row per code."""
    vq = VectorQuantizer(num_codes=len(codebook), code_dim=len(codebook[0]), decay=0.9, commitment=commitment, eps=eps)
    vq.codebook.copy_(torch.tensor(codebook))
    vq.embed_sum.copy_(vq.codebook)
    return vq


def test_ema_update_by_hand():
    vq = small_vq([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0]], eps=0.1)
    z = torch.tensor([[0.1, 0.2], [0.9, 0.1], [1.1, -0.1], [0.2, 0.0]])
    codes = vq(z).codes
    assert codes.tolist() == [0, 1, 1, 0]
    counts, sums = vq.statistics(z, codes)
    assert counts.tolist() == [2.0, 2.0, 0.0]
    torch.testing.assert_close(sums, torch.tensor([[0.3, 0.2], [2.0, 0.0], [0.0, 0.0]]))
    vq.ema_update(counts, sums)
    # cluster_size = 0.9 * 1 + 0.1 * counts; embed_sum = 0.9 * codebook + 0.1 * sums
    size = [0.9 + 0.2, 0.9 + 0.2, 0.9]
    embed = [[0.03, 0.02], [0.9 + 0.2, 0.0], [0.0, 0.9]]
    n = sum(size)  # 3.1
    smoothed = [(s + 0.1) / (n + 3 * 0.1) * n for s in size]  # 1.2 * 3.1 / 3.4, 1.2 * 3.1 / 3.4, 3.1 / 3.4
    torch.testing.assert_close(vq.cluster_size, torch.tensor(size))
    torch.testing.assert_close(vq.embed_sum, torch.tensor(embed))
    torch.testing.assert_close(
        vq.codebook, torch.tensor([[e / s for e in row] for row, s in zip(embed, smoothed, strict=True)])
    )
    assert abs(vq.codebook[1, 0].item() - 1.1 / (1.2 * 3.1 / 3.4)) < 1e-6


def test_statistics_summed_over_two_halves_give_the_whole_batch_update():
    torch.manual_seed(0)
    vq = VectorQuantizer(num_codes=6, code_dim=4)
    vq.codebook.copy_(torch.randn(6, 4))
    vq.embed_sum.copy_(vq.codebook)
    z = torch.randn(20, 4)
    codes = vq(z).codes
    whole, halves = copy.deepcopy(vq), copy.deepcopy(vq)
    whole.ema_update(*vq.statistics(z, codes))
    (c0, s0), (c1, s1) = vq.statistics(z[:11], codes[:11]), vq.statistics(z[11:], codes[11:])
    halves.ema_update(c0 + c1, s0 + s1)  # what two ranks apply after an all-reduce sum
    for name in ("codebook", "cluster_size", "embed_sum"):
        torch.testing.assert_close(getattr(halves, name), getattr(whole, name))
    assert not torch.equal(whole.codebook, vq.codebook)


def test_forward_nearest_code_straight_through_and_commitment_by_hand():
    vq = small_vq([[0.0, 0.0], [2.0, 0.0], [0.0, 2.0]])
    before = {k: v.clone() for k, v in vq.state_dict().items()}
    z = torch.tensor([[1.2, 0.1], [0.1, 1.1]], requires_grad=True)
    out = vq(z)
    # row 0: squared distances 1.45, 0.65, 5.05; row 1: 1.22, 4.82, 0.82
    assert out.codes.tolist() == [1, 2] and out.codes.dtype == torch.int64
    torch.testing.assert_close(out.quantized, torch.tensor([[2.0, 0.0], [0.0, 2.0]]))
    assert abs(out.loss.item() - 0.5 * (0.8**2 + 0.1**2 + 0.1**2 + 0.9**2) / 4) < 1e-6
    w = torch.tensor([[1.0, -2.0], [3.0, 0.5]])
    (grad,) = torch.autograd.grad((out.quantized * w).sum(), z, retain_graph=True)
    torch.testing.assert_close(grad, w)  # d/dz = d/dq: straight through
    (grad,) = torch.autograd.grad(out.loss, z)
    torch.testing.assert_close(grad, 0.5 * 2 * (z.detach() - out.quantized.detach()) / 4)
    assert all(torch.equal(v, before[k]) for k, v in vq.state_dict().items())  # no state change
    assert set(before) == {"codebook", "cluster_size", "embed_sum"}  # all persistent


def test_revive_replaces_dead_codes_and_keeps_them_at_their_candidate():
    vq = small_vq([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    vq.cluster_size.copy_(torch.tensor([3.0, 0.2, 2.0, 0.1]))
    dead = vq.dead(0.5)
    assert dead.tolist() == [False, True, False, True]
    old = {k: v.clone() for k, v in vq.state_dict().items()}
    vq.revive(dead, torch.tensor([[5.0, 5.0], [6.0, 6.0], [7.0, 7.0]]))
    assert vq.codebook.tolist() == [[0.0, 0.0], [5.0, 5.0], [0.0, 1.0], [6.0, 6.0]]
    assert vq.embed_sum[[1, 3]].tolist() == [[5.0, 5.0], [6.0, 6.0]]
    assert vq.cluster_size.tolist() == [3.0, 1.0, 2.0, 1.0]
    for name in ("codebook", "embed_sum", "cluster_size"):  # live codes untouched
        assert torch.equal(getattr(vq, name)[[0, 2]], old[name][[0, 2]])
    vq.ema_update(torch.zeros(4), torch.zeros(4, 2))  # no row picks anything
    # cluster_size 0.9 * [3, 1, 2, 1], embed_sum 0.9 * embed_sum; the 0.9 cancels but for smoothing
    n = 0.9 * 7
    smoothed = (0.9 + 1e-5) / (n + 4 * 1e-5) * n
    torch.testing.assert_close(vq.codebook[1], torch.tensor([4.5 / smoothed, 4.5 / smoothed]))
    torch.testing.assert_close(vq.codebook[[1, 3]], torch.tensor([[5.0, 5.0], [6.0, 6.0]]), rtol=1e-4, atol=0)
    cycled = small_vq([[0.0], [1.0], [2.0]])
    cycled.revive(torch.tensor([True, True, True]), torch.tensor([[7.0], [8.0]]))  # fewer candidates than dead
    assert cycled.codebook.flatten().tolist() == [7.0, 8.0, 7.0]


def test_codebook_stats_by_hand():
    perplexity, usage = codebook_stats(torch.tensor([5.0, 5.0, 0.0, 5.0]))
    assert abs(perplexity - 3.0) < 1e-9 and usage == 0.75  # equal use: the number of codes used
    perplexity, usage = codebook_stats(torch.tensor([1.0, 3.0]))
    assert abs(perplexity - math.exp(-(0.25 * math.log(0.25) + 0.75 * math.log(0.75)))) < 1e-9 and usage == 1.0
    assert codebook_stats(torch.zeros(4)) == (0.0, 0.0)


def brute_force_loss(logits: torch.Tensor, targets: torch.Tensor, masked: torch.Tensor, types: torch.Tensor) -> float:
    """The minimum over every one-to-one pairing within each row and type, by enumeration."""
    ce = -logits.log_softmax(-1)
    total = 0.0
    for r in range(targets.shape[0]):
        for t in types.unique().tolist():
            pos = [i for i in range(targets.shape[1]) if masked[r, i] and types[i] == t]
            if pos:
                total += min(
                    sum(ce[r, i, targets[r, j]].item() for i, j in zip(pos, perm, strict=True))
                    for perm in itertools.permutations(pos)
                )
    return total / max(int(masked.sum()), 1)


@pytest.mark.parametrize("seed", range(6))
def test_typewise_hungarian_loss_is_the_brute_force_minimum_and_order_free(seed):
    gen = torch.manual_seed(seed)
    types = torch.tensor([S, A, A, A, E, E, E, E])
    logits = torch.randn(3, 8, 5, generator=gen) * 3
    targets = torch.randint(0, 5, (3, 8), generator=gen)
    masked = torch.rand(3, 8, generator=gen) < 0.7
    masked[0, 1:] = True  # every ally and enemy of row 0
    loss = typewise_hungarian_loss(logits, targets, masked, types)
    assert abs(loss.item() - brute_force_loss(logits, targets, masked, types)) < 1e-5
    shuffled = targets.clone()
    for r in range(3):
        for t in (A, E):
            pos = [i for i in range(8) if masked[r, i] and types[i] == t]
            shuffled[r, pos] = targets[r, [pos[k] for k in torch.randperm(len(pos), generator=gen).tolist()]]
    torch.testing.assert_close(typewise_hungarian_loss(logits, shuffled, masked, types), loss)
    folded = typewise_hungarian_loss(logits.view(3, 1, 8, 5), targets.view(3, 1, 8), masked.view(3, 1, 8), types)
    torch.testing.assert_close(folded, loss)  # leading dims flattened


def test_typewise_hungarian_loss_matches_within_types_only_and_has_gradients():
    types = torch.tensor([S, A, A, E])
    logits = torch.full((1, 4, 4), -10.0)
    logits[0, 1, 2] = logits[0, 2, 3] = logits[0, 3, 0] = logits[0, 0, 1] = 10.0
    logits.requires_grad_(True)
    masked = torch.tensor([[False, True, True, True]])
    swapped = torch.tensor([[1, 3, 2, 0]])  # the two allies' targets swapped
    loss = typewise_hungarian_loss(logits, swapped, masked, types)
    assert loss.item() < 1e-6 and masked_cross_entropy(logits, swapped, masked).item() > 10
    (grad,) = torch.autograd.grad(masked_cross_entropy(logits, swapped, masked) + loss, logits)
    assert (grad[0, 0] == 0).all() and (grad[0, 1:].abs().sum(-1) > 0).all()  # masked nodes only
    across = torch.tensor([[1, 0, 3, 2]])  # an ally's target sits at the enemy: no cross-type match
    assert typewise_hungarian_loss(logits, across, masked, types).item() > 10
    nothing = torch.zeros(1, 4, dtype=torch.bool)
    for fn in (typewise_hungarian_loss, masked_cross_entropy):
        args = (logits, swapped, nothing, types) if fn is typewise_hungarian_loss else (logits, swapped, nothing)
        zero = fn(*args)
        assert zero.item() == 0.0 and zero.requires_grad


def test_masked_cross_entropy_by_hand():
    logits = torch.tensor([[[1.0, 2.0, 0.0], [0.0, 0.0, 3.0], [5.0, 0.0, 0.0]]])
    targets = torch.tensor([[1, 0, 2]])
    masked = torch.tensor([[True, True, False]])

    def ce(row: list[float], t: int) -> float:
        return math.log(sum(math.exp(v) for v in row)) - row[t]

    expected = (ce([1.0, 2.0, 0.0], 1) + ce([0.0, 0.0, 3.0], 0)) / 2
    assert abs(masked_cross_entropy(logits, targets, masked).item() - expected) < 1e-6


def test_mask_positions_rule():
    types = torch.tensor([S, A, A, A, A, E, E, E, E])  # 8 non-SELF nodes: ceil(0.3 * 8) = 3 to mask
    gen = torch.Generator().manual_seed(0)
    visible = torch.rand(400, 9, generator=gen) < torch.rand(400, 1, generator=gen)  # rows from all to none seen
    visible[:50, 0] = False  # SELF is never masked, even where a caller calls it unseen
    masked = mask_positions(visible, types, 0.3, gen)
    hidden = ~visible[:, 1:]
    assert not masked[:, 0].any()
    assert (masked[:, 1:] | ~hidden).all()  # every unseen non-SELF node
    n_hidden = hidden.sum(-1)
    assert torch.equal(masked.sum(-1), n_hidden.clamp_min(3))  # at least the ratio's count, no more
    enough = n_hidden >= 3
    assert enough.any() and (~enough).any()
    assert torch.equal(masked[enough, 1:], hidden[enough])  # no visible node once the unseen reach it
    drawn = masked & visible
    drawn[:, 0] = False
    assert (drawn.sum(0)[1:] > 0).all()  # the draw reaches every position
    assert torch.equal(mask_positions(visible, types, 0.3, torch.Generator().manual_seed(1)).sum(-1), masked.sum(-1))
    assert torch.equal(mask_positions(visible, types, 0.0, gen)[:, 1:], hidden)


def tiny_models(seed: int = 0) -> tuple[Tokenizer, MaskedTokenPredictor]:
    torch.manual_seed(seed)
    tokenizer = Tokenizer(LAYOUT.width, hidden=16, num_codes=8, code_dim=4)
    tokenizer.vq.codebook.copy_(torch.randn(8, 4))  # spread codes: different nodes get different tokens
    predictor = MaskedTokenPredictor(8, LAYOUT.n_nodes, d_model=16, n_heads=2, n_layers=1, ffn_dim=32)
    return tokenizer, predictor


def test_tokenizer_losses_ignore_invalid_nodes():
    tokenizer, _ = tiny_models()
    types, fmask = LAYOUT.type_ids(), LAYOUT.feature_mask()
    gen = torch.Generator().manual_seed(3)
    nodes = LAYOUT.to_nodes(torch.randn(4, 2, 13, generator=gen))
    valid = torch.rand(4, 2, 5, generator=gen) < 0.6
    assert valid.any() and (~valid).any()
    out = tokenizer(nodes, types, valid)
    assert out.recon.shape == (4, 2, 5, 3) and out.codes.shape == (4, 2, 5) and out.z.shape == (4, 2, 5, 4)
    assert torch.equal(out.codes, tokenizer.tokens(nodes, types))
    q = tokenizer.vq.lookup(out.codes)
    assert abs(out.vq_loss.item() - 0.5 * (out.z - q)[valid].square().mean().item()) < 1e-6
    err = reconstruction_error(out.recon, nodes, fmask, valid)
    changed = nodes.clone()
    changed[~valid] = 100 * torch.randn(int((~valid).sum()), 3, generator=gen)
    out2 = tokenizer(changed, types, valid)
    torch.testing.assert_close(out2.vq_loss, out.vq_loss)
    torch.testing.assert_close(reconstruction_error(out2.recon, changed, fmask, valid), err)
    changed[valid] += 1.0  # a valid node's features do count
    out3 = tokenizer(changed, types, valid)
    assert abs(out3.vq_loss.item() - out.vq_loss.item()) > 1e-6
    assert abs(reconstruction_error(out3.recon, changed, fmask, valid).item() - err.item()) > 1e-6
    torch.testing.assert_close(tokenizer.features(out.codes, types), tokenizer.decode(q, types))


def test_reconstruction_error_by_hand():
    recon = torch.tensor([[[1.0, 2.0, 9.0], [0.5, 7.0, 7.0], [4.0, 4.0, 4.0]]])
    nodes = torch.tensor([[[0.0, 0.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0]]])
    fmask = torch.tensor([[True, True, False], [True, False, False], [True, True, True]])
    valid = torch.tensor([[True, True, False]])
    # real features of valid nodes: (1-0)^2, (2-0)^2, (0.5-1)^2
    assert abs(reconstruction_error(recon, nodes, fmask, valid).item() - (1 + 4 + 0.25) / 3) < 1e-6
    assert reconstruction_error(recon, nodes, fmask, torch.zeros(1, 3, dtype=torch.bool)).item() == 0.0


def test_predictor_reads_masked_tokens_as_mask_and_flattens_leading_dims():
    _, predictor = tiny_models()
    predictor.eval()
    types = LAYOUT.type_ids()
    gen = torch.Generator().manual_seed(4)
    tokens = torch.randint(0, 8, (2, 3, 5), generator=gen)
    masked = torch.rand(2, 3, 5, generator=gen) < 0.5
    logits = predictor(tokens, masked, types)
    assert logits.shape == (2, 3, 5, 8)
    torch.testing.assert_close(predictor(tokens.view(6, 5), masked.view(6, 5), types).view(2, 3, 5, 8), logits)
    other = torch.where(masked, (tokens + 1) % 8, tokens)
    torch.testing.assert_close(predictor(other, masked, types), logits)
    none = torch.zeros_like(masked)
    assert not torch.allclose(predictor(other, none, types), predictor(tokens, none, types))  # unmasked: read


def test_reconstructer_keeps_visible_nodes_and_fills_the_others():
    tokenizer, predictor = tiny_models()
    rec = Reconstructer(LAYOUT, tokenizer, predictor).eval()
    types = LAYOUT.type_ids()
    gen = torch.Generator().manual_seed(5)
    obs = torch.randn(3, 2, 13, generator=gen)
    nodes = LAYOUT.to_nodes(obs)
    nodes[torch.rand(3, 2, 5, generator=gen) < 0.5] = 0.0  # unseen units
    obs = LAYOUT.from_nodes(nodes).requires_grad_(True)
    before = {k: v.clone() for k, v in rec.state_dict().items()}
    out = rec(obs)
    assert out.shape == obs.shape and not out.requires_grad
    seen = LAYOUT.visible(nodes)
    assert seen.any() and (~seen).any()
    got = LAYOUT.to_nodes(out)
    assert torch.equal(got[seen], nodes[seen])  # bit for bit
    codes = predictor(tokenizer.tokens(nodes, types), ~seen, types).argmax(-1)
    expected = torch.where(LAYOUT.feature_mask(), tokenizer.features(codes, types), 0.0)
    torch.testing.assert_close(got[~seen], expected[~seen])
    assert (got[~seen] != 0).any(-1).all()  # filled in
    _, _, decoded = rec.predict_nodes(obs)
    assert (decoded[..., ~LAYOUT.feature_mask()] == 0).all()  # padding
    assert all(torch.equal(v, before[k]) for k, v in rec.state_dict().items())
    assert all(p.grad is None for p in rec.parameters())


def test_nearest_is_the_closest_code_by_brute_force_with_codes_of_different_lengths():
    g = torch.Generator().manual_seed(4)
    vq = VectorQuantizer(num_codes=16, code_dim=3)
    vq.codebook.copy_(torch.randn(16, 3, generator=g) * torch.linspace(0.1, 3.0, 16)[:, None])
    z = torch.randn(200, 3, generator=g) * 2
    assert torch.equal(vq.nearest(z), torch.cdist(z, vq.codebook).argmin(-1))


def test_commitment_loss_of_no_rows_is_zero():
    vq = small_vq([[0.0, 0.0], [1.0, 1.0]])
    assert vq.commitment_loss(torch.zeros(0, 2), torch.zeros(0, 2)).item() == 0.0
    z = torch.ones(3, 2)
    assert vq.commitment_loss(z, torch.zeros(3, 2), torch.zeros(3, dtype=torch.bool)).item() == 0.0


def test_a_code_counted_exactly_at_the_threshold_is_alive_and_one_candidate_serves_every_dead_code():
    vq = small_vq([[0.0, 0.0], [1.0, 1.0], [2.0, 2.0]])
    vq.cluster_size.copy_(torch.tensor([0.05, 0.01, 3.0]))
    assert vq.dead(0.05).tolist() == [False, True, False]
    vq.cluster_size.copy_(torch.tensor([0.01, 0.01, 3.0]))
    vq.revive(vq.dead(0.05), torch.tensor([[7.0, 8.0]]))
    assert vq.codebook.tolist() == [[7.0, 8.0], [7.0, 8.0], [2.0, 2.0]]


def test_mask_positions_takes_leading_dims_row_by_row_and_draws_from_its_generator_only():
    types = torch.tensor([S, A, A, A, A, E, E, E, E])
    gen = torch.Generator().manual_seed(2)
    visible = torch.rand(4, 50, 9, generator=gen) < torch.rand(4, 50, 1, generator=gen)  # (4, 50, N): 200 rows
    torch.manual_seed(0)
    masked = mask_positions(visible, types, 0.3, torch.Generator().manual_seed(5))
    hidden = ~visible[..., 1:]
    assert torch.equal(masked.sum(-1), hidden.sum(-1).clamp_min(3))  # per row, not per column
    assert (masked[..., 1:] | ~hidden).all() and not masked[..., 0].any()
    torch.manual_seed(1)  # another global stream: the same draw
    assert torch.equal(mask_positions(visible, types, 0.3, torch.Generator().manual_seed(5)), masked)


def test_revive_refuses_no_candidates_and_codebook_stats_of_a_single_row():
    vq = small_vq([[0.0, 0.0], [1.0, 1.0]])
    with pytest.raises(ValueError, match="at least one candidate"):
        vq.revive(torch.tensor([True, False]), torch.zeros(0, 2))
    assert codebook_stats(torch.tensor([0.0, 1.0, 0.0, 0.0])) == (1.0, 0.25)
