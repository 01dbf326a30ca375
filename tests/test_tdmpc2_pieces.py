"""Unit tests of the TD-MPC2 pieces: math, networks, MPPI planner, episodic buffer.

Facts checked against docs/references.md#td-mpc2; expected numbers are hand-computed here.
All CPU, small: the whole file runs in seconds on 2 cores.
"""

import math

import pytest
import torch
import torch.nn.functional as F

from ddprl.algos.tdmpc2.buffer import EpisodeBuffer
from ddprl.algos.tdmpc2.math import (
    NUM_BINS,
    RunningScale,
    discount_for_episode_length,
    gaussian_log_prob,
    soft_ce,
    squash_log_std,
    squashed_gaussian_sample,
    symexp,
    symlog,
    two_hot,
    two_hot_inv,
)
from ddprl.algos.tdmpc2.networks import (
    MODEL_SIZES,
    Mish,
    ModelDims,
    PolicyPrior,
    QEnsemble,
    SimNorm,
    WorldModel,
    dims_for_model_size,
    mish,
)
from ddprl.algos.tdmpc2.planner import MPPI, MPPIConfig, mppi_iterations

TINY = ModelDims(enc_dim=32, mlp_dim=48, latent_dim=24, num_enc_layers=2, num_q=5)


# --------------------------------------------------------------------------- math


def test_symlog_symexp_are_inverse():
    x = torch.tensor([-1e4, -50.0, -1.0, -1e-3, 0.0, 1e-3, 0.5, 7.0, 1e4], dtype=torch.float64)
    torch.testing.assert_close(symexp(symlog(x)), x)
    torch.testing.assert_close(symlog(symexp(x[2:-2])), x[2:-2])
    assert symlog(torch.tensor(math.e - 1)).item() == pytest.approx(1.0)


def test_two_hot_round_trip_and_clamp():
    # inside the support: |symlog x| <= 10  <=>  |x| <= e^10 - 1 ~ 22025
    x = torch.tensor([-2e4, -1234.5, -3.0, -0.25, 0.0, 0.1, 1.0, 42.0, 999.0, 2e4], dtype=torch.float64)[:, None]
    enc = two_hot(x)
    assert enc.shape == (10, NUM_BINS)
    torch.testing.assert_close(enc.sum(-1), torch.ones(10, dtype=torch.float64))
    assert ((enc > 0).sum(-1) <= 2).all()  # two-hot: at most two non-zero bins
    torch.testing.assert_close(two_hot_inv(torch.log(enc + 1e-30)), x, rtol=1e-6, atol=1e-6)
    # outside: clamped to the edge bins, decoded as +-(e^10 - 1)
    far = two_hot(torch.tensor([[1e6], [-1e6]], dtype=torch.float64))
    assert far[0, -1] == 1 and far[1, 0] == 1
    torch.testing.assert_close(
        two_hot_inv(torch.log(far + 1e-30)).abs().squeeze(), torch.full((2,), math.expm1(10.0), dtype=torch.float64)
    )


def test_soft_ce_is_minimised_at_matching_target():
    y = torch.tensor([[3.7]])
    candidates = torch.linspace(-10, 10, 201)[:, None]  # 3.7 is on the grid
    logits = torch.log(two_hot(candidates) + 1e-8)  # (201, K): one candidate distribution each
    losses = soft_ce(logits, y.expand(201, 1)).squeeze(-1)
    assert candidates[losses.argmin()].item() == pytest.approx(3.7, abs=1e-5)
    # and gradient descent on free logits converges to a distribution decoding to y
    free = torch.zeros(1, NUM_BINS, requires_grad=True)
    opt = torch.optim.Adam([free], lr=0.5)
    for _ in range(300):
        opt.zero_grad()
        soft_ce(free, y).sum().backward()
        opt.step()
    assert two_hot_inv(free).item() == pytest.approx(3.7, abs=0.05)


def test_gaussian_and_squash_helpers_match_torch_distributions():
    torch.manual_seed(0)
    # float64: with log_std near -10, float32 loses digits recovering eps from u in torch's form
    mean, log_std, eps = (torch.randn(6, 4, dtype=torch.float64) for _ in range(3))
    log_std = squash_log_std(log_std)
    u = mean + eps * log_std.exp()
    normal = torch.distributions.Normal(mean, log_std.exp())
    torch.testing.assert_close(gaussian_log_prob(eps, log_std), normal.log_prob(u).sum(-1, keepdim=True))
    a, mu, lp = squashed_gaussian_sample(mean, log_std, eps)
    squashed = torch.distributions.TransformedDistribution(normal, [torch.distributions.TanhTransform()])
    torch.testing.assert_close(lp, squashed.log_prob(a).sum(-1, keepdim=True), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(mu, torch.tanh(mean))
    ls = squash_log_std(torch.tensor([-1e4, 0.0, 1e4]))
    torch.testing.assert_close(ls, torch.tensor([-10.0, -4.0, 2.0]))


def test_running_scale_ema_of_percentile_range():
    scale = RunningScale()
    x = torch.linspace(0, 100, 10001)  # 5th..95th percentile range = 90
    scale.update(x)
    assert scale.value.item() == pytest.approx(0.99 * 1 + 0.01 * 90, rel=1e-5)
    # a small range is clamped to 1 (TD-MPC2: never below 1): value stays at 1 from the start
    small = RunningScale()
    small.update(torch.linspace(0, 0.1, 100))
    assert small.value.item() == pytest.approx(1.0)
    assert "value" in scale.state_dict()
    torch.testing.assert_close(scale(torch.tensor([1.89])), torch.tensor([1.0]))  # divides by the scale


def test_discount_heuristic():
    assert discount_for_episode_length(500) == pytest.approx(0.99)  # DMC
    assert discount_for_episode_length(10) == pytest.approx(0.95)  # (2-1)/2 = 0.5, clipped up
    assert discount_for_episode_length(100_000) == pytest.approx(0.995)  # clipped down
    assert discount_for_episode_length(250) == pytest.approx(0.98)
    with pytest.raises(ValueError):
        discount_for_episode_length(0)


# --------------------------------------------------------------------------- networks


def test_simnorm_groups_sum_to_one():
    out = SimNorm()(torch.randn(3, 5, 64) * 10)
    groups = out.reshape(3, 5, 8, 8)
    torch.testing.assert_close(groups.sum(-1), torch.ones(3, 5, 8))
    assert (out >= 0).all()


def _hand_count(obs: int, A: int, d: ModelDims, K: int = NUM_BINS) -> int:
    """Parameters counted by hand from the layer list of docs/references.md#architecture."""
    lin = lambda i, o: i * o + o  # noqa: E731
    nl = lambda i, o: lin(i, o) + 2 * o  # NormedLinear: Linear + LayerNorm(weight, bias)  # noqa: E731
    e, h, z = d.enc_dim, d.mlp_dim, d.latent_dim
    n_hidden = max(d.num_enc_layers - 1, 1)
    enc = nl(obs, e) + (n_hidden - 1) * nl(e, e) + nl(e, z)
    dyn = nl(z + A, h) + nl(h, h) + nl(h, z)
    head = nl(z + A, h) + nl(h, h) + lin(h, K)  # reward, and each Q
    pi = nl(z, h) + nl(h, h) + lin(h, 2 * A)
    return enc + dyn + head * (1 + d.num_q) + pi


def test_parameter_count_model_size_5_dog_run():
    model = WorldModel(obs_dim=223, action_dim=38, model_size=5)
    n = sum(p.numel() for p in model.parameters())  # online nets only: the target is buffers
    assert n == _hand_count(223, 38, MODEL_SIZES[5]) == 5_159_082
    assert abs(n - 5.16e6) / 5.16e6 < 0.02


@pytest.mark.parametrize("size", [1, 19, 48, 317])
def test_every_size_builds_with_table_dims(size):
    d = dims_for_model_size(size)
    with torch.device("meta"):  # no memory: 317M parameters would not fit a CI box
        model = WorldModel(obs_dim=223, action_dim=38, model_size=size)
    assert sum(p.numel() for p in model.parameters()) == _hand_count(223, 38, d)
    enc = [m.linear for m in model.encoder]
    assert len(enc) == max(d.num_enc_layers - 1, 1) + 1
    assert enc[0].in_features == 223 and all(layer.out_features == d.enc_dim for layer in enc[:-1])
    assert enc[-1].out_features == d.latent_dim
    assert model.dynamics[0].linear.in_features == d.latent_dim + 38
    assert model.dynamics[1].linear.out_features == d.mlp_dim and model.dynamics[2].linear.out_features == d.latent_dim
    assert model.reward_head[-1].out_features == NUM_BINS
    assert model.qs.weight0.shape == (d.num_q, d.latent_dim + 38, d.mlp_dim)
    assert model.qs.weight2.shape == (d.num_q, d.mlp_dim, NUM_BINS)
    assert model.policy.net[-1].out_features == 2 * 38


def test_unknown_model_size_names_valid_sizes():
    with pytest.raises(ValueError, match="1, 5, 19, 48, 317"):
        dims_for_model_size(7)


def test_init_zeroes_reward_and_q_heads():
    model = WorldModel(10, 3, dims=TINY)
    assert (model.reward_head[-1].weight == 0).all() and (model.qs.weight2 == 0).all()
    w = model.dynamics[0].linear.weight
    assert w.std().item() == pytest.approx(0.02, rel=0.1) and (model.dynamics[0].linear.bias == 0).all()
    z, a = model.encode(torch.randn(4, 10)), torch.zeros(4, 3)
    torch.testing.assert_close(model.Q(z, a, "avg"), torch.zeros(4, 1))  # zero head -> Q = 0


def test_mish_on_the_cpu_equals_torch_mish_values_and_gradients():
    """networks.mish computes Mish from one exp on a CPU, its gradient by hand (faster there than
    torch's own kernel): values and gradients agree with F.mish from far below zero to past the
    clamp (20), in float32 and float64, through autograd and torch.func alike; half types take
    F.mish (e^x (e^x + 2) overflows float16); the module keeps nn.Mish's empty state dict (checkpoints
    unchanged)."""
    x = torch.cat([torch.linspace(-60, 60, 2001), torch.randn(4096) * 3]).requires_grad_()
    ours = mish(x)
    (grad_ours,) = torch.autograd.grad(ours.sum(), x)
    theirs = F.mish(x)
    (grad_theirs,) = torch.autograd.grad(theirs.sum(), x)
    torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(grad_ours, grad_theirs, rtol=1e-5, atol=1e-6)
    assert torch.isfinite(ours).all() and torch.isfinite(grad_ours).all()
    assert Mish().state_dict() == {} == torch.nn.Mish().state_dict()
    torch.testing.assert_close(Mish()(x.detach()), theirs.detach(), rtol=1e-6, atol=1e-6)

    x64 = x.detach().double()
    torch.testing.assert_close(mish(x64), F.mish(x64), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(
        torch.func.grad(lambda v: mish(v).sum())(x64), torch.func.grad(lambda v: F.mish(v).sum())(x64)
    )
    assert torch.autograd.gradcheck(mish, (torch.randn(16, dtype=torch.float64, requires_grad=True) * 4,))
    for half in (torch.float16, torch.bfloat16):
        xh = x.detach().to(half)
        torch.testing.assert_close(mish(xh), F.mish(xh))
        assert torch.isfinite(mish(xh)).all()


def _per_member_q(qs: QEnsemble, x: torch.Tensor) -> torch.Tensor:
    """Reference: evaluate each member separately with plain functional layers (eval mode)."""
    outs = []
    for q in range(qs.num_q):
        h = x
        for i in range(qs.num_layers):
            h = F.linear(h, getattr(qs, f"weight{i}")[q].T, getattr(qs, f"bias{i}")[q])
            if i < qs.num_layers - 1:
                h = F.mish(
                    F.layer_norm(h, h.shape[-1:], getattr(qs, f"ln_weight{i}")[q], getattr(qs, f"ln_bias{i}")[q])
                )
        outs.append(h)
    return torch.stack(outs)


def test_q_ensemble_batched_equals_per_member_loop():
    torch.manual_seed(0)
    qs = QEnsemble(num_q=5, in_dim=12, hidden=16).eval()  # eval: dropout off
    with torch.no_grad():
        for t in qs.tensors():
            t.normal_()
    x = torch.randn(3, 4, 12)  # (H, B, in)
    out = qs(x)
    assert out.shape == (5, 3, 4, NUM_BINS)
    torch.testing.assert_close(out, _per_member_q(qs, x), rtol=1e-4, atol=1e-4)
    members = torch.tensor([3, 1])
    torch.testing.assert_close(qs(x, members=members), out[members])


def test_q_ensemble_drops_out_the_first_layer_only_in_training(monkeypatch):
    """TD-MPC2's Q dropout acts once, on the first layer's output (before its LayerNorm), and only
    in training: the call's input is that layer's affine map of the input, computed here."""
    torch.manual_seed(0)
    qs = QEnsemble(num_q=3, in_dim=12, hidden=16, dropout=0.25)
    with torch.no_grad():
        for t in qs.tensors():
            t.normal_()
    x = torch.randn(7, 12)
    calls = []
    dropout = F.dropout

    def recording(h, p, training):
        calls.append((h.detach().clone(), p, training))
        return dropout(h, p, training)

    monkeypatch.setattr(F, "dropout", recording)
    qs.train()(x)
    assert len(calls) == 1
    h, p, training = calls[0]
    first = torch.einsum("ni,mio->mno", x, qs.weight0) + qs.bias0.unsqueeze(1)  # (Q, N, hidden)
    torch.testing.assert_close(h, first)
    assert p == 0.25 and training
    calls.clear()
    qs.eval()(x)
    assert all(not training for _, _, training in calls)


def test_q_return_types_and_detach():
    torch.manual_seed(0)
    model = WorldModel(10, 3, dims=TINY)
    with torch.no_grad():
        model.qs.weight2.normal_()
    z = model.encode(torch.randn(6, 10)).detach().requires_grad_(True)
    a = torch.rand(6, 3)
    assert model.Q(z, a, "all").shape == (5, 6, NUM_BINS)
    assert model.Q(z, a, "min").shape == (6, 1)
    model.eval()
    torch.manual_seed(1)
    q_min = model.Q(z, a, "min")
    torch.manual_seed(1)
    q_avg = model.Q(z, a, "avg")  # same 2 members drawn
    assert (q_min <= q_avg + 1e-6).all()
    model.Q(z, a, "avg", detach=True).sum().backward()
    assert z.grad is not None and z.grad.abs().sum() > 0
    assert all(p.grad is None for p in model.qs.parameters())  # Q params untouched
    with pytest.raises(ValueError):
        model.Q(z, a, "max")


def test_target_copy_make_and_soft_update():
    torch.manual_seed(0)
    model = WorldModel(10, 3, dims=TINY)
    assert not any(n.startswith("target_qs") for n, _ in model.named_parameters())
    with torch.no_grad():  # stands in for the broadcast overwriting the online weights
        for p in model.qs.parameters():
            p.add_(torch.randn_like(p))
    model.make_target()
    for t, p in zip(model.target_qs.tensors(), model.qs.tensors(), strict=True):
        torch.testing.assert_close(t, p)
    old = [t.clone() for t in model.target_qs.tensors()]
    with torch.no_grad():
        for p in model.qs.parameters():
            p.add_(1.0)
    model.soft_update_target(0.01)
    for t, o, p in zip(model.target_qs.tensors(), old, model.qs.tensors(), strict=True):
        torch.testing.assert_close(t, 0.99 * o + 0.01 * p)


def test_world_model_forward_shapes_and_gradients():
    torch.manual_seed(0)
    model = WorldModel(10, 3, dims=TINY)
    with torch.no_grad():  # non-zero heads so every layer carries a gradient
        model.qs.weight2.normal_()
        model.reward_head[-1].weight.normal_()
    H, B = 3, 4
    obs, act = torch.randn(H + 1, B, 10), torch.rand(H, B, 3) * 2 - 1
    out = model(obs, act, torch.randn(H, B, 1), torch.zeros(H, B, 1), 0.99)
    assert out["z"].shape == (H + 1, B, 24) and out["next_z"].shape == (H, B, 24)
    assert out["reward_logits"].shape == (H, B, NUM_BINS) and out["q_logits"].shape == (5, H, B, NUM_BINS)
    assert out["td_target"].shape == (H, B, 1) and not out["td_target"].requires_grad
    assert not out["next_z"].requires_grad and out["z"].requires_grad
    torch.testing.assert_close(out["z"][0], model.encode(obs[0]))
    torch.testing.assert_close(out["z"][1], model.next(out["z"][0], act[0]))
    # every online world-model parameter gets a gradient; the policy (own DDP) gets none
    (out["z"].square().sum() + out["reward_logits"].sum() + out["q_logits"].sum()).backward()
    for name, p in model.named_parameters():
        assert (p.grad is None) == name.startswith("policy."), name


def test_policy_prior_outputs():
    torch.manual_seed(0)
    model = WorldModel(10, 3, dims=TINY)
    a, info = model.pi(torch.randn(7, 24))
    assert a.shape == (7, 3) and (a.abs() < 1).all()
    assert ((info["log_std"] >= -10) & (info["log_std"] <= 2)).all()
    torch.testing.assert_close(info["entropy"], -info["log_prob"])


def test_scaled_entropy_counts_the_gaussian_part_action_dim_times():
    # The official release's bonus: -(A * log N(u) - log-det of tanh), log N summed over the
    # A dims. Written out here for A = 3, known noise and log-std.
    A, eps = 3, torch.tensor([[0.5, -1.0, 2.0]])
    pi = PolicyPrior(latent_dim=4, mlp_dim=8, action_dim=A)
    with torch.no_grad():
        pi.net[-1].weight.zero_()
        pi.net[-1].bias.copy_(torch.tensor([0.3, -0.2, 0.1, 0.0, 0.0, 0.0]))  # mean; raw log-std 0
    _, info = pi(torch.zeros(1, 4), eps)
    log_std = info["log_std"]  # squashed from 0: -4 (the middle of [-10, 2])
    assert torch.allclose(log_std, torch.full((1, A), -4.0))
    u = torch.tensor([[0.3, -0.2, 0.1]]) + eps * log_std.exp()
    gauss = (-0.5 * eps**2 - log_std - 0.5 * math.log(2 * math.pi)).sum()
    log_det = torch.log(1 - torch.tanh(u) ** 2).sum()
    assert info["scaled_entropy"].item() == pytest.approx(-(A * gauss - log_det).item(), rel=1e-5)
    assert info["entropy"].item() == pytest.approx(-(gauss - log_det).item(), rel=1e-5)
    # one action dim: nothing to scale
    pi1 = PolicyPrior(latent_dim=4, mlp_dim=8, action_dim=1)
    _, info1 = pi1(torch.randn(5, 4))
    torch.testing.assert_close(info1["scaled_entropy"], info1["entropy"])


def test_logits_stay_fp32_under_bf16_autocast():
    torch.manual_seed(0)
    model = WorldModel(10, 3, dims=TINY, dropout=0.0)
    with torch.no_grad():  # last layers start at zero: give them something to round
        for t in model.qs.tensors():
            t.normal_(0.0, 0.5)
        model.reward_head[-1].weight.normal_(0.0, 0.5)
    z, a = torch.randn(16, TINY.latent_dim), torch.rand(16, 3) * 2 - 1
    with torch.autocast("cpu", dtype=torch.bfloat16):
        q_logits = model.Q(z, a, "all")
        r_logits = model.reward(z, a)
        _, info = model.pi(z)
    assert q_logits.dtype == r_logits.dtype == info["log_std"].dtype == torch.float32
    # the fp32 last layer on the (bf16) features: what an fp32 logit layer gives
    with torch.autocast("cpu", dtype=torch.bfloat16):
        hidden = model.reward_head[:-1](torch.cat([z, a], -1))
    head = model.reward_head[-1]
    torch.testing.assert_close(r_logits, hidden.float() @ head.weight.t() + head.bias)


def test_target_qs_never_use_dropout():
    torch.manual_seed(0)
    model = WorldModel(10, 3, dims=TINY, dropout=0.5).train()
    assert model.qs.training and not model.target_qs.training
    with torch.no_grad():  # the last layer starts at zero: give the Qs something to say
        for t in model.qs.tensors():
            t.normal_(0.0, 0.5)
        model.make_target()
    z, a = torch.randn(64, TINY.latent_dim), torch.rand(64, 3) * 2 - 1
    members = torch.tensor([0, 1])
    first, second = (model.Q(z, a, "min", target=True, members=members) for _ in range(2))
    torch.testing.assert_close(first, second)  # no dropout masks in the target
    online = [model.Q(z, a, "min", members=members) for _ in range(2)]
    assert not torch.equal(*online)  # the online Qs do use dropout in training
    model.eval().train()
    assert not model.target_qs.training


# --------------------------------------------------------------------------- planner


def _toy_planner(target: torch.Tensor, **cfg) -> MPPI:
    # z' = z + a, r = -|z + a - target|^2, Q = 0: the best first action is target - z0
    return MPPI(
        next_fn=lambda z, a: z + a,
        reward_fn=lambda z, a: -(z + a - target).pow(2).sum(-1, keepdim=True),
        value_fn=lambda z, a: torch.zeros(*z.shape[:-1], 1),
        pi_fn=lambda z, eps: torch.zeros_like(z),
        action_dim=target.shape[-1],
        discount=0.99,
        cfg=MPPIConfig(**cfg),
    )


def test_mppi_finds_optimum_on_toy_problem():
    target = torch.tensor([0.6, -0.4])
    z0 = torch.tensor([[0.0, 0.0], [0.3, 0.1]])  # two start states planned at once
    plan = _toy_planner(target).plan(z0, eval_mode=True, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(plan.mean[0], target - z0, atol=0.05, rtol=0)
    torch.testing.assert_close(plan.action, target - z0, atol=0.15, rtol=0)
    assert plan.mean.shape == plan.std.shape == (3, 2, 2)
    assert (plan.std >= 0.05).all() and (plan.std <= 2).all()


def test_mppi_action_clamped_and_deterministic_with_generator():
    planner = _toy_planner(torch.tensor([5.0]), num_pi_trajs=4)  # optimum outside [-1, 1]
    p1 = planner.plan(torch.zeros(1, 1), generator=torch.Generator().manual_seed(3))
    p2 = planner.plan(torch.zeros(1, 1), generator=torch.Generator().manual_seed(3))
    torch.testing.assert_close(p1.action, p2.action)
    assert p1.action.abs().max() <= 1 and p1.action.item() > 0.8


def test_mppi_warm_start_shifts_previous_mean():
    # a (near) zero sampling std: every sample equals the warm-started mean, so the refit mean
    # is that mean: the previous plan one step later, with a new last step at 0
    planner = _toy_planner(torch.tensor([0.0]), iterations=1, num_pi_trajs=0, min_std=1e-6, max_std=1e-6)
    prev = torch.tensor([0.1, 0.2, 0.3]).reshape(3, 1, 1)  # (H, E, A)
    plan = planner.plan(torch.zeros(1, 1), prev_mean=prev, eval_mode=True)
    torch.testing.assert_close(plan.mean.flatten(), torch.tensor([0.2, 0.3, 0.0]), atol=1e-5, rtol=0)
    torch.testing.assert_close(plan.action.flatten(), torch.tensor([0.2]), atol=1e-5, rtol=0)


def test_mppi_iterations_rule_and_world_model_adapter():
    assert mppi_iterations(6) == 6 and mppi_iterations(20) == 8 and mppi_iterations(38) == 8
    model = WorldModel(10, 21, dims=TINY)
    planner = MPPI.from_world_model(model, discount=0.99)
    assert planner.cfg.iterations == 8
    planner.cfg = MPPIConfig(iterations=2, num_samples=64, num_elites=8, num_pi_trajs=4)
    plan = planner.plan(model.encode(torch.randn(2, 10)))
    assert plan.action.shape == (2, 21) and plan.mean.shape == (3, 2, 21)


# --------------------------------------------------------------------------- buffer


def _episode(ep_id: int, T: int, terminated: bool = False):
    """obs[t] = (ep_id, t); action[t] = (ep_id, t); reward[t] = 1000 ep_id + t."""
    steps = torch.arange(T + 1, dtype=torch.float32)
    obs = torch.stack([torch.full((T + 1,), float(ep_id)), steps], -1)
    term = torch.zeros(T, dtype=torch.bool)
    term[-1] = terminated
    return obs, obs[:-1].clone(), 1000 * ep_id + steps[:-1], term


def _check_batch(batch, horizon):
    ep, step = batch.obs[..., 0], batch.obs[..., 1]  # (H+1, B)
    assert (ep == ep[0:1]).all(), "a sample crossed an episode boundary"
    assert (step == step[0:1] + torch.arange(horizon + 1)[:, None]).all()
    torch.testing.assert_close(batch.action, batch.obs[:-1])
    torch.testing.assert_close(batch.reward.squeeze(-1), 1000 * ep[:-1] + step[:-1])


def test_buffer_never_crosses_episode_boundaries():
    buf = EpisodeBuffer(capacity=500, obs_dim=2, action_dim=2)
    lengths = [5, 3, 2, 17, 8, 1, 30]  # some shorter than the horizon: never sampled
    for i, T in enumerate(lengths):
        buf.add_episode(*_episode(i, T, terminated=(i % 2 == 0)))
    batch = buf.sample(256, horizon=3, generator=torch.Generator().manual_seed(0))
    assert batch.obs.shape == (4, 256, 2) and batch.action.shape == (3, 256, 2)
    assert batch.reward.shape == batch.terminated.shape == (3, 256, 1)
    _check_batch(batch, 3)
    assert not set(batch.obs[0, :, 0].long().tolist()) & {2, 5}  # T < H episodes
    # terminated is set exactly on the last transition of terminated episodes
    ep, step = batch.obs[:-1, :, 0].long(), batch.obs[:-1, :, 1].long()
    T_of = torch.tensor(lengths)[ep]
    expect = (step == T_of - 1) & (ep % 2 == 0)
    assert (batch.terminated.squeeze(-1).bool() == expect).all()


def test_buffer_uniform_over_start_positions():
    buf = EpisodeBuffer(capacity=200, obs_dim=2, action_dim=2)
    buf.add_episode(*_episode(0, 5))  # 5 - 3 + 1 = 3 starts
    buf.add_episode(*_episode(1, 50))  # 48 starts
    assert buf.num_starts(3) == 51
    batch = buf.sample(20_000, horizon=3, generator=torch.Generator().manual_seed(1))
    frac0 = (batch.obs[0, :, 0] == 0).float().mean().item()
    assert frac0 == pytest.approx(3 / 51, abs=0.01)
    starts = batch.obs[0, batch.obs[0, :, 0] == 1, 1]
    assert starts.min() == 0 and starts.max() == 47  # every valid start, none past it


def test_buffer_circular_overwrite_evicts_oldest_whole_episodes():
    buf = EpisodeBuffer(capacity=40, obs_dim=2, action_dim=2)
    for i in range(10):  # 10 episodes of 9 rows each; only 4 fit
        buf.add_episode(*_episode(i, 8))
    assert buf.num_episodes == 4 and len(buf) == 32
    batch = buf.sample(512, horizon=3, generator=torch.Generator().manual_seed(2))
    _check_batch(batch, 3)
    assert set(batch.obs[0, :, 0].long().tolist()) == {6, 7, 8, 9}
    # a long episode that does not fit in the tail wraps to row 0 and evicts what it overlaps
    buf.add_episode(*_episode(10, 20))
    batch = buf.sample(512, horizon=3, generator=torch.Generator().manual_seed(3))
    _check_batch(batch, 3)
    assert 10 in set(batch.obs[0, :, 0].long().tolist())
    with pytest.raises(ValueError):
        buf.add_episode(*_episode(11, 40))  # 41 rows > capacity
    with pytest.raises(ValueError):
        EpisodeBuffer(capacity=10, obs_dim=2, action_dim=2).sample(4, horizon=3)  # empty


def _constant_target_qs(model: WorldModel, values: list[float]) -> None:
    """Target Q member j outputs ``values[j]`` whatever its input: its last layer's weight zero, its
    bias the log of the two-hot encoding of that value."""
    qs = model.target_qs
    last = qs.num_layers - 1
    with torch.no_grad():
        getattr(qs, f"weight{last}").zero_()
        bias = getattr(qs, f"bias{last}")
        for j, v in enumerate(values):
            bias[j] = torch.log(two_hot(torch.tensor([[v]]))[0] + 1e-30)


def test_td_target_is_reward_plus_discounted_min_of_the_two_target_qs_by_hand():
    """TD target = r + discount * (1 - terminated) * min(Q_target[m0], Q_target[m1]), with target
    members of known values: members (0, 3) of values (2, -1, 4, 3, 0.5) give min(2, 3) = 2."""
    torch.manual_seed(0)
    model = WorldModel(10, 3, dims=TINY)
    model.make_target()
    _constant_target_qs(model, [2.0, -1.0, 4.0, 3.0, 0.5])
    with torch.no_grad():  # the online Qs differ from the targets: the target must be the one used
        for p in model.qs.parameters():
            p.add_(1.0)
    H, B = 3, 2
    next_z = torch.randn(H, B, TINY.latent_dim)
    reward = torch.tensor([[1.0, -0.5], [0.25, 2.0], [0.0, 1.5]]).unsqueeze(-1)  # (H, B, 1)
    terminated = torch.tensor([[0.0, 0.0], [0.0, 1.0], [1.0, 0.0]]).unsqueeze(-1)
    target = model.td_target(next_z, reward, terminated, 0.9, members=torch.tensor([0, 3]))
    expected = torch.tensor([[1.0 + 0.9 * 2, -0.5 + 0.9 * 2], [0.25 + 0.9 * 2, 2.0], [0.0, 1.5 + 0.9 * 2]])
    torch.testing.assert_close(target, expected.unsqueeze(-1), rtol=0, atol=1e-4)
    # another pair: members (1, 4) -> min(-1, 0.5) = -1; without termination flags every step bootstraps
    target = model.td_target(next_z, reward, None, 0.5, members=torch.tensor([4, 1]))
    torch.testing.assert_close(target, reward - 0.5, rtol=0, atol=1e-4)
    # and through the forward pass the learner differentiates, at the discount it is given
    obs, act = torch.randn(H + 1, B, 10), torch.rand(H, B, 3) * 2 - 1
    out = model(obs, act, reward, terminated, 0.9, members=torch.tensor([3, 0]))
    torch.testing.assert_close(out["td_target"], expected.unsqueeze(-1), rtol=0, atol=1e-4)
