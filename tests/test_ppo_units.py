"""PPO's small pieces against hand-computed values."""

from __future__ import annotations

import contextlib
import functools
import math

import gymnasium as gym
import numpy as np
import pytest
import torch

from ddprl.algos.ppo.loss import ppo_loss, standardize
from ddprl.algos.ppo.networks import ActorCritic, PolicyOutput, run_mlp
from ddprl.algos.ppo.rollout import Rollout, RolloutBuffer, compute_gae, obs_storage_dtype
from ddprl.normalize import ReturnScaler, RunningMeanStd


def rollout_of(rewards, values, terminated, truncated, final_values):
    def t(x, dt=torch.float32):  # (T, N=1)
        return torch.tensor(x, dtype=dt).reshape(-1, 1)

    z = torch.zeros(len(rewards), 1)
    return Rollout(
        obs=z,
        actions=z,
        log_probs=z,
        values=t(values),
        rewards=t(rewards),
        terminated=t(terminated, torch.bool),
        truncated=t(truncated, torch.bool),
        final_values=t(final_values),
    )


def test_gae_terminated_does_not_bootstrap():
    g, lam = 0.9, 0.5
    r = rollout_of([1.0, 2.0, 3.0], [0.5, 1.0, 1.5], [0, 1, 0], [0, 0, 0], [0, 0, 0])
    adv, ret = compute_gae(r, torch.tensor([2.0]), g, lam)
    d2 = 3.0 + g * 2.0 - 1.5  # last step bootstraps from next_values
    d1 = 2.0 + 0.0 - 1.0  # terminated: no bootstrap, chain cut
    d0 = 1.0 + g * 1.0 - 0.5
    expected = [d0 + g * lam * d1, d1, d2]
    assert torch.allclose(adv.flatten(), torch.tensor(expected))
    assert torch.allclose(ret, adv + r.values)


def test_gae_truncated_bootstraps_from_final_obs():
    g, lam = 0.9, 0.5
    r = rollout_of([1.0, 2.0], [0.5, 1.0], [0, 0], [1, 0], [7.0, 0.0])
    adv, _ = compute_gae(r, torch.tensor([3.0]), g, lam)
    d1 = 2.0 + g * 3.0 - 1.0
    d0 = 1.0 + g * 7.0 - 0.5  # V(final_obs) = 7, not V(next episode's first obs) = 1.0
    assert torch.allclose(adv.flatten(), torch.tensor([d0, d1]))  # chain cut at the truncation


def test_ppo_loss_matches_hand_computation():
    new_lp = torch.tensor([math.log(0.5), math.log(0.9)])
    old_lp = torch.tensor([math.log(0.4), math.log(0.5)])
    adv = torch.tensor([1.0, -1.0])
    out = PolicyOutput(action=None, log_prob=new_lp, entropy=torch.tensor([0.6, 0.4]), value=torch.tensor([1.0, 3.0]))
    terms = ppo_loss(
        out,
        old_lp,
        old_values=torch.tensor([0.0, 2.5]),
        advantages=adv,
        returns=torch.tensor([2.0, 2.0]),
        clip_coef=0.2,
        clip_vloss=False,
        vf_coef=0.5,
        ent_coef=0.01,
    )
    # ratios 1.25 and 1.8: the first is clipped to 1.2 (A>0), the second's max(-A*r, -A*clip(r)) = 1.8
    pg = (-1.0 * 1.2 + 1.8) / 2
    v = 0.5 * ((1.0 - 2.0) ** 2 + (3.0 - 2.0) ** 2) / 2
    assert terms["policy_loss"].item() == pytest.approx(pg, rel=1e-5)
    assert terms["value_loss"].item() == pytest.approx(v, rel=1e-5)
    assert terms["loss"].item() == pytest.approx(pg - 0.01 * 0.5 + 0.5 * v, rel=1e-5)
    assert terms["clip_frac"].item() == pytest.approx(1.0)
    clipped = ppo_loss(out, old_lp, torch.tensor([0.0, 2.5]), adv, torch.tensor([2.0, 2.0]), 0.2, True, 0.5, 0.01)
    # clipped value for sample 0: 0 + clamp(1.0, -0.2, 0.2) = 0.2 → (0.2-2)^2 = 3.24 > 1
    assert clipped["value_loss"].item() == pytest.approx(0.5 * (3.24 + 1.0) / 2, rel=1e-5)


def test_ppo_loss_clips_on_both_sides_of_the_ratio_and_the_value_by_hand():
    """One sample in each region of the clipped surrogate (A > 0 or < 0, ratio above 1 + c or below
    1 - c) and one inside, with c = 0.2; values clipped to old_value +- c from either side."""
    ratio = torch.tensor([1.5, 0.5, 0.5, 1.5, 1.1])
    adv = torch.tensor([1.0, 1.0, -1.0, -1.0, 2.0])
    old_lp = torch.full((5,), math.log(0.4))
    out = PolicyOutput(
        action=None,
        log_prob=old_lp + ratio.log(),
        entropy=torch.tensor([0.6, 0.4, 0.5, 0.3, 0.2]),
        value=torch.tensor([1.0, 3.0, 0.5, -1.1, 0.0]),
    )
    old_values, returns = torch.tensor([0.0, 2.5, 1.0, -1.0, 0.0]), torch.tensor([2.0, 2.0, 0.0, -3.0, 1.0])
    terms = ppo_loss(out, old_lp, old_values, adv, returns, 0.2, True, 0.5, 0.01)
    # max(-A r, -A clip(r, 0.8, 1.2)) per sample: -1.2, -0.5, 0.8, 1.5, -2.2
    pg = (-1.2 - 0.5 + 0.8 + 1.5 - 2.2) / 5
    # clipped values 0.2, 2.7, 0.8, -1.1, 0.0; max of the two squared errors: 3.24, 1, 0.64, 3.61, 1
    v = 0.5 * (3.24 + 1.0 + 0.64 + 3.61 + 1.0) / 5
    assert terms["policy_loss"].item() == pytest.approx(pg, rel=1e-5)
    assert terms["value_loss"].item() == pytest.approx(v, rel=1e-5)
    assert terms["entropy"].item() == pytest.approx(0.4, rel=1e-6)
    assert terms["loss"].item() == pytest.approx(pg - 0.01 * 0.4 + 0.5 * v, rel=1e-5)
    assert terms["clip_frac"].item() == pytest.approx(0.8)
    kl = sum((r - 1) - math.log(r) for r in ratio.tolist()) / 5
    assert terms["approx_kl"].item() == pytest.approx(kl, rel=1e-5)
    unclipped = ppo_loss(out, old_lp, old_values, adv, returns, 0.2, False, 0.5, 0.01)
    assert unclipped["value_loss"].item() == pytest.approx(0.5 * (1.0 + 1.0 + 0.25 + 3.61 + 1.0) / 5, rel=1e-5)


def test_actor_critic_shapes_and_scoring():
    torch.manual_seed(0)
    net = ActorCritic(gym.spaces.Box(-1, 1, (3,)), gym.spaces.Box(-1, 1, (2,)), hidden_sizes=[8])
    out = net(torch.zeros(5, 3))
    assert out.action.shape == (5, 2) and out.log_prob.shape == (5,) and out.value.shape == (5,)
    again = net(torch.zeros(5, 3), out.action)
    assert torch.allclose(again.log_prob, out.log_prob)  # scoring a given action reproduces its log-prob
    cnn = ActorCritic(gym.spaces.Box(0, 1, (4, 6, 6)), gym.spaces.Discrete(4), policy="cnn", policy_width=8)
    assert cnn(torch.zeros(2, 4, 6, 6)).action.shape == (2,)
    with pytest.raises(ValueError, match="C x H x W"):
        ActorCritic(gym.spaces.Box(-1, 1, (3,)), gym.spaces.Discrete(2), policy="cnn")


def test_activation_key_picks_the_mlp_hidden_layers_and_is_refused_for_cnn():
    from ddprl.config import load_config
    from ddprl.errors import UsageError

    def hidden_activations(net):
        return {type(m).__name__ for m in net.modules() if isinstance(m, (torch.nn.Tanh, torch.nn.ReLU))}

    spaces = (gym.spaces.Box(-1, 1, (3,)), gym.spaces.Discrete(2))
    assert hidden_activations(ActorCritic(*spaces, hidden_sizes=[8])) == {"Tanh"}
    assert hidden_activations(ActorCritic(*spaces, hidden_sizes=[8], activation="relu")) == {"ReLU"}
    assert load_config([]).activation == "tanh"
    with pytest.raises(UsageError, match="activation='gelu' is not tanh or relu"):
        load_config(["activation=gelu"])
    cnn = load_config(["task=snake", "policy=cnn", "activation=relu", "world_size=1"])
    with pytest.raises(UsageError, match="policy=cnn is relu throughout"):
        cnn.check()
    load_config(["task=snake", "policy=cnn", "world_size=1"]).check()  # the default says nothing: accepted


def test_log_std_init_and_ortho_init_set_the_networks_starting_point():
    """The SB3 zoo's MuJoCo keys (log_std_init=-2, ortho_init=False): the log std starts where
    asked; without orthogonal init every layer is torch's own nn.Linear draw, biases included."""
    from types import SimpleNamespace

    from ddprl.algos.ppo.loop import build_agent
    from ddprl.config import load_config

    spaces = (gym.spaces.Box(-1, 1, (6,)), gym.spaces.Box(-1, 1, (2,)))
    env = SimpleNamespace(single_observation_space=spaces[0], single_action_space=spaces[1])
    default = load_config(["task=Pendulum-v1"])
    assert (default.log_std_init, default.ortho_init) == (0.0, True)
    torch.manual_seed(0)
    ortho = build_agent(default, env)
    first = ortho.actor[0].weight.detach()  # (hidden, 6)
    torch.testing.assert_close(first.T @ first, 2.0 * torch.eye(6), atol=1e-5, rtol=0)  # orthogonal, gain sqrt 2
    assert not ortho.actor[0].bias.any() and not ortho.log_std.any()

    zoo = load_config(["task=Pendulum-v1", "log_std_init=-2", "ortho_init=false", "hidden_sizes=[32,32]"])
    torch.manual_seed(0)
    net = build_agent(zoo, env)
    torch.testing.assert_close(net.log_std.detach(), torch.full((2,), -2.0))
    torch.manual_seed(0)
    plain = torch.nn.Linear(6, 32)  # the first layer ActorCritic makes, drawn from the same stream
    torch.testing.assert_close(net.actor[0].weight, plain.weight)
    torch.testing.assert_close(net.actor[0].bias, plain.bias)
    w = net.actor[0].weight.detach()
    assert not torch.allclose(w.T @ w, 2.0 * torch.eye(6), atol=0.1)  # the check above can fail
    with pytest.raises(Exception, match="log_std_init"):
        load_config(["log_std_init=nan"])


def test_a_checkpoint_older_than_an_architecture_key_loads_with_that_keys_default():
    """A checkpoint written before ``activation`` existed has a tanh policy: eval, play and
    resume rebuild that network, and not what a layer of today would set."""
    from ddprl.prepare import saved_config

    old = {"algo": "ppo", "task": "CartPole-v1", "policy": "mlp", "hidden_sizes": [8], "run_dir": "runs/x"}
    layer = saved_config(old)
    assert layer["activation"] == "tanh" and "run_dir" not in layer  # the interrupted job's own setting dropped
    assert {k: layer[k] for k in old if k != "run_dir"} == {k: v for k, v in old.items() if k != "run_dir"}
    new = {**old, "activation": "relu", "engine": "jax"}
    assert saved_config(new)["activation"] == "relu"  # a key the checkpoint has is kept


@pytest.mark.parametrize("policy", ["mlp", "cnn"])
def test_output_heads_stay_fp32_under_bf16_autocast(policy):
    # A value of ~100.3 would be rounded to 100.5 by a bf16 head (8 significant bits).
    torch.manual_seed(0)
    obs_space = gym.spaces.Box(0, 1, (3, 5, 5)) if policy == "cnn" else gym.spaces.Box(-1, 1, (6,))
    net = ActorCritic(
        obs_space, gym.spaces.Discrete(4), policy=policy, hidden_sizes=[16], policy_width=4, policy_depth=1
    )
    value_head = net.critic if policy == "cnn" else net.critic[-1]
    with torch.no_grad():
        value_head.bias.fill_(100.3)
    obs = torch.rand(8, *obs_space.shape)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = net(obs)
        features = net.trunk(obs) if policy == "cnn" else net.critic[:-1](obs)
    assert out.value.dtype == torch.float32
    expected = features.float() @ value_head.weight.t().float() + value_head.bias
    torch.testing.assert_close(out.value, expected.squeeze(-1), rtol=0, atol=1e-4)
    assert (out.value - 100.5).abs().min() > 1e-3  # not on the bf16 grid around 100


@pytest.mark.parametrize("activation", ["tanh", "relu"])
@pytest.mark.parametrize("bf16", [False, True])
def test_run_mlp_gives_the_module_calls_bits_and_gradients(activation, bf16):
    torch.manual_seed(0)
    net = ActorCritic(
        gym.spaces.Box(-1, 1, (5,)), gym.spaces.Box(-1, 1, (3,)), hidden_sizes=[16, 8], activation=activation
    )
    obs = torch.randn(7, 5)
    autocast = torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()
    results = []
    for run in (lambda layers, x: layers(x), run_mlp):
        net.zero_grad()
        with autocast:
            actor, critic = run(net.actor, obs), run(net.critic, obs)
        (actor.sum() + critic.square().sum()).backward()
        results.append([actor, critic, *(p.grad.clone() for p in net.parameters() if p.grad is not None)])
    assert results[0][0].dtype == results[1][0].dtype == torch.float32  # the heads in fp32 either way
    assert len(results[0]) == len(results[1]) == 2 + 12  # each Linear's weight and bias got a gradient
    for by_module, by_ops in zip(*results, strict=True):
        assert torch.equal(by_module, by_ops)


def test_eval_action_argmax_or_sampled_from_its_own_generator():
    torch.manual_seed(0)
    net = ActorCritic(gym.spaces.Box(-1, 1, (3,)), gym.spaces.Discrete(3), hidden_sizes=[8])
    with torch.no_grad():
        net.actor[-1].bias.copy_(torch.tensor([0.0, 1.0, -1.0]))  # probs ~ (0.24, 0.67, 0.09)
    obs = torch.zeros(20_000, 3)
    assert torch.equal(net.eval_action(obs), torch.ones(20_000, dtype=torch.long))  # argmax
    rng_before = torch.get_rng_state()
    sampled = net.eval_action(obs, deterministic=False, generator=torch.Generator().manual_seed(5))
    assert torch.equal(torch.get_rng_state(), rng_before)  # the global (training) RNG is untouched
    again = net.eval_action(obs, deterministic=False, generator=torch.Generator().manual_seed(5))
    assert torch.equal(sampled, again)
    probs = net.distribution(net.trunk(obs[:1])).probs[0]
    freq = torch.bincount(sampled, minlength=3).float() / len(sampled)
    assert torch.allclose(freq, probs, atol=0.015), (freq, probs)
    cont = ActorCritic(gym.spaces.Box(-1, 1, (3,)), gym.spaces.Box(-1, 1, (2,)), hidden_sizes=[8])
    with torch.no_grad():
        cont.log_std.fill_(math.log(0.5))
    mean = cont.eval_action(obs)
    draws = cont.eval_action(obs, deterministic=False, generator=torch.Generator().manual_seed(1))
    assert torch.allclose((draws - mean).std(0), torch.full((2,), 0.5), atol=0.01)


def test_running_mean_std_matches_numpy_over_several_updates():
    rng = np.random.default_rng(0)
    chunks = [rng.normal(3.0, 2.0, size=(n, 2)) for n in (5, 17, 100)]
    rms = RunningMeanStd((2,))
    for c in chunks:
        rms.update(torch.as_tensor(c))
    allx = np.concatenate(chunks)
    assert np.allclose(rms.mean.numpy(), allx.mean(0)) and np.allclose(rms.var.numpy(), allx.var(0))
    x = torch.tensor([[3.0, 3.0]])
    assert torch.allclose(rms.normalize(x), (x - rms.mean.float()) / torch.sqrt(rms.var.float() + 1e-8))
    # a feature that never varies: variance 0, normalised to exactly 0 (eps keeps the root real), and
    # a far value clipped to +-10
    flat = RunningMeanStd((1,))
    flat.update(torch.full((8, 1), 4.0))
    assert float(flat.var) == 0.0 and float(flat.mean) == 4.0
    assert torch.equal(flat.normalize(torch.tensor([[4.0], [5.0], [3.0]])), torch.tensor([[0.0], [10.0], [-10.0]]))


def test_return_scaler_tracks_discounted_returns_across_rollouts():
    gamma = 0.9
    rewards = torch.tensor([[1.0, 2.0], [1.0, 0.0], [1.0, -1.0], [1.0, 3.0], [1.0, 1.0]])
    dones = torch.zeros(5, 2, dtype=torch.bool)
    dones[1, 1] = True  # env 1's episode ends after step 1: its return starts over at step 2
    whole = ReturnScaler(2, gamma).track(rewards, dones)
    expected = torch.zeros(5, 2)
    for n in range(2):
        g = 0.0
        for t in range(5):
            g = gamma * g + rewards[t, n].item()
            expected[t, n] = g
            g = 0.0 if dones[t, n] else g
    torch.testing.assert_close(whole, expected)
    split = ReturnScaler(2, gamma)  # two rollouts in a row continue each env's return
    torch.testing.assert_close(
        torch.cat([split.track(rewards[:3], dones[:3]), split.track(rewards[3:], dones[3:])]), expected
    )


def test_return_scaler_divides_by_the_return_std_and_clips():
    scaler = ReturnScaler(3, gamma=0.99, clip=5.0)
    rewards = torch.randn(64, 3) * 50.0
    dones = torch.rand(64, 3) < 0.05
    returns = ReturnScaler(3, gamma=0.99).track(rewards, dones)
    scaler.update(rewards, dones)
    std = returns.double().flatten().numpy().std()  # population std, like the running statistics
    assert scaler.stats.var.sqrt().item() == pytest.approx(std, rel=1e-6)
    scaled = scaler.scale(rewards)
    torch.testing.assert_close(scaled, (rewards / std).float().clamp(-5, 5), rtol=1e-5, atol=1e-6)
    assert scaled.abs().max() <= 5.0


def test_standardize_uses_the_mean_and_population_std_over_both_ranks_by_hand():
    """Two ranks' equal shares: each standardises with the moments averaged over both (a mean over
    ranks stands in for the all-reduce), which are the whole batch's: here mean 2, std sqrt(28 / 6)."""
    a = torch.tensor([0.0, 1.0, 3.0, 4.0, -1.0, 5.0])  # mean 2, population variance 28/6
    shares = a.view(2, 3)
    moments = [torch.stack([s.mean(), (s**2).mean()]) for s in shares]

    def mean_over_ranks(local: torch.Tensor) -> torch.Tensor:
        return (moments[0] + moments[1]) / 2  # what all_reduce_mean returns on both ranks

    for share in shares:
        out = standardize(share, mean_over_ranks)
        torch.testing.assert_close(out, (share - 2.0) / (math.sqrt(28 / 6) + 1e-8))
    # one process on the whole batch: the same numbers
    torch.testing.assert_close(standardize(a, lambda t: t), (a - 2.0) / (math.sqrt(28 / 6) + 1e-8))
    # a constant batch has no spread: centred, not divided by zero
    torch.testing.assert_close(standardize(torch.full((4,), 3.0), lambda t: t), torch.zeros(4))


def test_norm_adv_takes_true_false_or_minibatch():
    from ddprl.config import load_config
    from ddprl.errors import UsageError

    assert load_config([]).norm_adv is True
    assert load_config(["norm_adv=false"]).norm_adv is False
    assert load_config(["norm_adv=minibatch"]).norm_adv == "minibatch"
    for bad in ("batch", "1"):  # 1 is not true: a typo would otherwise pass as "on"
        with pytest.raises(UsageError, match="is not true, false or minibatch"):
            load_config([f"norm_adv={bad}"])


# -- the host rollout (a Gymnasium env on the CPU) ----------------------------------------------


def gym_rollout(task, num_envs, n_steps, on_host):
    """PPO's rollout of ``task`` as ``train`` builds it (norm_obs on), run by ``RolloutStep.host_steps``
    or, ``on_host=False``, by the per-step region ``RolloutStep.steps`` every env may run."""
    from ddprl.algos.ppo.rollout import RolloutBuffer, RolloutStep
    from ddprl.envs import make_env

    env = make_env(task, num_envs, seed=5)
    torch.manual_seed(0)
    policy = ActorCritic(env.single_observation_space, env.single_action_space, hidden_sizes=[16, 16])
    rms = RunningMeanStd(tuple(env.single_observation_space.shape))
    rms.update(torch.randn(32, *env.single_observation_space.shape, generator=torch.Generator().manual_seed(1)))
    action_shape = tuple(env.single_action_space.shape)
    dtype = torch.long if policy.discrete else torch.float32
    buffer = RolloutBuffer(
        n_steps, num_envs, tuple(env.single_observation_space.shape), action_shape, dtype, env.device
    )
    rollout = RolloutStep(env, policy, buffer, rms.normalize, contextlib.nullcontext(), obs=env.reset())
    assert rollout.on_host
    rollout.on_host = on_host
    return rollout


@pytest.mark.parametrize("joint", [False, True])
@pytest.mark.parametrize("task", ["CartPole-v1", "Pendulum-v1"])
def test_host_rollout_stores_what_the_step_region_stores(task, joint):
    """On the CPU a Gymnasium rollout runs ``host_steps``: over two rollouts, its stored rows,
    episode sums, next observation and draws from the global generator are those of the region
    ``steps``, bit for bit (CartPole's episodes end, Pendulum's are truncated at 200 steps).
    Acting through the joint MLP (as ``train`` does here), the log-probs and values are the
    same to float rounding; CartPole's actions, and so everything else, bit for bit; Pendulum's
    actions (mean + std x noise) to rounding, and so the trajectory, its ends bit for bit."""
    runs = []
    for on_host in (True, False):
        rollout = gym_rollout(task, num_envs=3, n_steps=160, on_host=on_host)
        assert rollout.joint is not None  # an MLP policy in fp32 on a CPU host env
        if not joint:
            rollout.joint = None
        torch.manual_seed(7)
        sums = [torch.stack(rollout.collect()) for _ in range(2)]
        runs.append((rollout, sums, torch.get_rng_state()))
    (host, host_sums, host_rng), (region, region_sums, region_rng) = runs
    continuous = task == "Pendulum-v1"
    for name, a, b in zip(host.buffer.data._fields, host.buffer.data, region.buffer.data, strict=True):
        assert a.dtype == b.dtype, name
        # acting jointly: log-probs and values to rounding; Pendulum's actions too, and what follows from them
        rounded = {"log_probs", "values"} | ({"obs", "actions", "rewards", "final_values"} if continuous else set())
        if joint and name in rounded:
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5, msg=name)
            assert name != "values" or not torch.equal(a, b)  # the joint act ran: its sums round apart
        else:
            assert torch.equal(a, b), name
    same = functools.partial(torch.allclose, rtol=1e-5) if joint and continuous else torch.equal
    assert all(same(a, b) for a, b in zip(host_sums, region_sums, strict=True))
    assert float(host_sums[1][1]) > 0  # episodes ended in the second rollout
    if continuous:
        assert bool(host.buffer.data.truncated.any()) and bool(host.buffer.data.final_values.ne(0).any())
    assert same(host.obs, region.obs) and torch.equal(host_rng, region_rng)
    assert int(host.cursor) == int(region.cursor) == 160


@pytest.mark.parametrize("action_space", [gym.spaces.Discrete(3), gym.spaces.Box(-1, 1, (2,))])
def test_act_with_noise_scores_its_action_as_the_update_does(action_space):
    """The rollout's log-prob (``act_with_noise``, no distribution object) is the update's
    (``forward``: torch's Categorical / Normal) bit for bit: the first epoch's ratio is exactly 1."""
    torch.manual_seed(0)
    net = ActorCritic(gym.spaces.Box(-1, 1, (4,)), action_space, hidden_sizes=[8], log_std_init=-0.3)
    obs = torch.randn(64, 4)
    with torch.no_grad():
        action, log_prob, value = net.act_with_noise(obs, net.fill_noise_(torch.empty(64, *net.noise_shape)))
        out = net(obs, action)
    assert torch.equal(log_prob, out.log_prob) and torch.equal(value, out.value)


@pytest.mark.parametrize("hidden_sizes, activation", [([64, 64], "tanh"), ([8], "relu"), ([], "tanh")])
@pytest.mark.parametrize("action_space", [gym.spaces.Discrete(3), gym.spaces.Box(-1, 1, (2,))])
def test_the_joint_act_is_act_with_noise_to_rounding(action_space, hidden_sizes, activation):
    """Actor and critic as one network act as the two do: the same actions from the same draws
    (to rounding where they are mean + std x noise), log-probs and values to float rounding; built
    from the parameters as they are when it is made (a rollout makes one after each update)."""
    torch.manual_seed(0)
    net = ActorCritic(
        gym.spaces.Box(-1, 1, (4,)), action_space, hidden_sizes=hidden_sizes, activation=activation, log_std_init=-0.3
    )
    obs = torch.randn(64, 4)
    noise = net.fill_noise_(torch.empty(64, *net.noise_shape))
    with torch.no_grad():
        joint = net.joint_act()
        for p in net.parameters():  # an update moves every parameter
            p.add_(0.1 * torch.randn_like(p))
        ref, got, stale = net.act_with_noise(obs, noise), net.joint_act()(obs, noise), joint(obs, noise)
    if net.discrete:
        assert torch.equal(got[0], ref[0]) and got[0].unique().numel() > 1
    for a, b in zip(got, ref, strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
    assert not torch.allclose(stale[2], ref[2], atol=1e-3)  # made before the step: the old values


def test_acts_jointly_where_acting_is_bound_by_op_count():
    """The joint act serves an MLP policy in fp32 on a host env of a CPU rank, nothing else."""
    from types import SimpleNamespace

    from ddprl.algos.ppo.rollout import acts_jointly

    box, actions = gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(2)
    mlp, cnn = ActorCritic(box, actions), ActorCritic(gym.spaces.Box(0, 255, (3, 8, 8)), actions, policy="cnn")
    cpu_host, gpu_host = SimpleNamespace(device=torch.device("cpu")), SimpleNamespace(device=torch.device("cuda"))
    traced = SimpleNamespace(device=torch.device("cpu"), traceable_step=True)  # Snake: acting is inside the graph
    fp32, bf16 = contextlib.nullcontext(), torch.autocast("cpu", dtype=torch.bfloat16)
    assert acts_jointly(cpu_host, mlp, fp32)
    assert not acts_jointly(cpu_host, cnn, fp32)
    assert not acts_jointly(cpu_host, mlp, bf16)
    assert not acts_jointly(gpu_host, mlp, fp32)
    assert not acts_jointly(traced, mlp, fp32)


@pytest.mark.parametrize("task", ["CartPole-v1", "Pendulum-v1", "Blackjack-v1"])
def test_gym_vec_env_steps_as_gymnasiums_sync_vector_env(task):
    """GymVecEnv steps its envs as Gymnasium's SyncVectorEnv does in SAME_STEP mode: for the same
    seeds and actions, the same observations (encoded where the space is not a Box), rewards,
    ends and last observations (CartPole's and Blackjack's episodes end, Pendulum's are cut)."""
    from gymnasium.vector import AutoresetMode

    from ddprl.envs import make_env
    from ddprl.envs.flatten import FlatEncoder

    n = 3
    env = make_env(task, n, seed=4)
    ref = gym.vector.SyncVectorEnv([lambda: gym.make(task)] * n, autoreset_mode=AutoresetMode.SAME_STEP)
    space = ref.single_observation_space
    flat = None if isinstance(space, gym.spaces.Box) else FlatEncoder(space)

    def encoded(batch) -> torch.Tensor:
        return torch.as_tensor(batch if flat is None else flat(batch, n), dtype=torch.float32)

    ref_obs, _ = ref.reset(seed=4)
    assert torch.equal(env.reset(), encoded(ref_obs))
    ref.action_space.seed(0)
    ends = 0
    for _ in range(230):
        action = ref.action_space.sample()
        obs, reward, terminated, truncated, info = env.step(torch.as_tensor(action))
        ref_obs, ref_reward, ref_terminated, ref_truncated, ref_info = ref.step(action)
        assert torch.equal(obs, encoded(ref_obs))
        assert torch.equal(reward, torch.as_tensor(ref_reward, dtype=torch.float32))
        assert torch.equal(terminated, torch.as_tensor(ref_terminated))
        assert torch.equal(truncated, torch.as_tensor(ref_truncated))
        for i in np.flatnonzero(ref_terminated | ref_truncated):
            last = ref_info["final_obs"][i]
            want = torch.as_tensor(last if flat is None else flat.each([last])[0], dtype=torch.float32)
            assert torch.equal(info["final_obs"][i], want)
            ends += 1
    assert ends >= n  # every env ended an episode at least once on average
    env.close()
    ref.close()


def test_gym_vec_env_step_types_and_episode_counters():
    """A Gymnasium step crosses as float32 / bool / int64 tensors; the episode return and length
    reported where an episode ends survive the counters' reset, which the next step starts from."""
    from ddprl.envs import make_env

    env = make_env("CartPole-v1", 2, seed=0)
    env.reset()
    length, ends = torch.zeros(2, dtype=torch.int64), 0
    for _ in range(100):  # pushing left ends an episode in ~10 steps (CartPole pays 1 a step)
        obs, reward, terminated, truncated, info = env.step(torch.zeros(2, dtype=torch.long))
        assert (obs.dtype, reward.dtype, terminated.dtype, truncated.dtype) == (torch.float32,) * 2 + (torch.bool,) * 2
        assert (info["episode_return"].dtype, info["episode_length"].dtype) == (torch.float32, torch.int64)
        length += 1
        assert torch.equal(info["episode_length"], length) and torch.equal(info["episode_return"], length.float())
        done = terminated | truncated
        if done.any():
            assert not torch.equal(info["final_obs"][done], obs[done])  # the last observation, not the next first
            length[done], ends = 0, ends + int(done.sum())
    assert ends >= 4
    env.close()


def test_pixels_are_stored_as_bytes_exactly():
    """A uint8 observation space (Atari's frames) is stored as bytes, a quarter of float32's
    memory; the float32 pixels the env hands over come back unchanged."""
    pixels = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
    assert obs_storage_dtype(pixels) == torch.uint8
    assert obs_storage_dtype(gym.spaces.Box(-1.0, 1.0, (3,), np.float32)) == torch.float32
    buffer = RolloutBuffer(2, 3, pixels.shape, (), torch.long, torch.device("cpu"), obs_storage_dtype(pixels))
    frames = torch.randint(0, 256, (3, 4, 84, 84)).float()
    buffer.store(1, obs=frames)
    assert buffer.data.obs.dtype == torch.uint8 and buffer.data.obs.element_size() == 1
    assert torch.equal(buffer.data.obs[1].float(), frames)


def test_channels_last_storage_keeps_the_frames_and_gathers_minibatches_channels_last():
    """Frames stored H x W x C read back as the env gave them (C x H x W); the update's flat view
    and a minibatch gathered from it are channels-last (what the CPU convolutions take), so the
    gather copies whole frames; the Nature CNN asks for it on a CPU only."""
    from ddprl.algos.ppo.update import update_batch

    shape = (4, 84, 84)
    buffer = RolloutBuffer(2, 3, shape, (), torch.long, torch.device("cpu"), torch.uint8, obs_channels_last=True)
    frames = torch.randint(0, 256, (2, 3, *shape), dtype=torch.uint8)
    for t in range(2):
        buffer.store(t, obs=frames[t])
    assert buffer.data.obs.shape == (2, 3, *shape) and torch.equal(buffer.data.obs, frames)
    flat = update_batch(buffer)["obs"]
    assert flat.data_ptr() == buffer.data.obs.data_ptr()  # a view: no copy of the rollout
    minibatch = flat[torch.tensor([5, 0, 3])]
    assert minibatch.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(minibatch, frames.flatten(0, 1)[[5, 0, 3]])
    with pytest.raises(ValueError, match="C x H x W frames"):
        RolloutBuffer(2, 3, (8,), (), torch.long, torch.device("cpu"), obs_channels_last=True)
    space = gym.spaces.Box(0, 255, shape, np.uint8)
    cnn = ActorCritic(space, gym.spaces.Discrete(4), policy="nature_cnn")
    assert cnn.frames_channels_last(torch.device("cpu")) and not cnn.frames_channels_last(torch.device("cuda"))
    mlp = ActorCritic(gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(2))
    assert not mlp.frames_channels_last(torch.device("cpu"))


# -- the loop's pieces around the update, on a stand-in for two ranks ---------------------------------


class TwoEqualRanks:
    """A runtime of 2 ranks whose other rank holds the same values as this one: a sum over ranks is
    twice the local value, a mean the local value (what the loop's arithmetic is checked against)."""

    world_size = 2
    device = torch.device("cpu")

    def all_reduce_sum(self, value):
        if isinstance(value, dict):
            return {k: self.all_reduce_sum(v) for k, v in value.items()}
        return value * 2

    def all_reduce_mean(self, value):
        return value


def test_iteration_metrics_sum_the_ranks_rates_and_average_their_times_by_hand():
    from ddprl.algos.ppo.loop import iteration_metrics

    m = iteration_metrics(
        TwoEqualRanks(), 64, 0.3, 0.1, torch.tensor(30.0), torch.tensor(3.0), effective_batch=128, lr=0.25
    )
    assert m["time/global_fps"] == pytest.approx(2 * 64 / 0.4)  # each rank's steps per second, summed
    assert m["time/rollout_s"] == pytest.approx(0.3) and m["time/update_s"] == pytest.approx(0.1)
    assert m["train/episode_return"] == pytest.approx(10.0)  # 60 over 6 episodes
    assert m["train/effective_batch_size"] == 128 and m["train/lr"] == 0.25
    no_episodes = iteration_metrics(TwoEqualRanks(), 64, 0.3, 0.1, torch.tensor(0.0), torch.tensor(0.0), 128, 0.25)
    assert "train/episode_return" not in no_episodes


def test_advantages_and_returns_scale_rewards_then_normalise_advantages_by_hand():
    """One env, 3 steps, no episode end, gamma 0.5, lambda 1: the GAE of the given rewards; with
    norm_reward the rewards are divided by the std of the discounted return (statistics of both
    ranks, equal here), with norm_adv the advantages standardised over the (global) rollout."""
    from ddprl.algos.ppo.loop import advantages_and_returns
    from ddprl.config import load_config

    T, N = 3, 1
    zeros = torch.zeros(T, N)
    rollout = Rollout(
        obs=zeros.unsqueeze(-1),
        actions=zeros.long(),
        log_probs=zeros,
        values=torch.tensor([[1.0], [0.5], [0.0]]),
        rewards=torch.tensor([[1.0], [2.0], [4.0]]),
        terminated=zeros.bool(),
        truncated=zeros.bool(),
        final_values=zeros,
    )
    next_values = torch.tensor([2.0])
    # deltas r + 0.5 V' - V: 1 + 0.25 - 1 = 0.25, 2 + 0 - 0.5 = 1.5, 4 + 1 - 0 = 5
    # A_2 = 5, A_1 = 1.5 + 0.5 * 5 = 4, A_0 = 0.25 + 0.5 * 4 = 2.25; returns = A + V
    plain = load_config(["gamma=0.5", "gae_lambda=1.0", "norm_adv=false", "norm_reward=false"])
    adv, ret = advantages_and_returns(TwoEqualRanks(), plain, rollout, next_values, ReturnScaler(N, 0.5))
    torch.testing.assert_close(adv, torch.tensor([[2.25], [4.0], [5.0]]))
    torch.testing.assert_close(ret, torch.tensor([[3.25], [4.5], [5.0]]))

    normalised = load_config(["gamma=0.5", "gae_lambda=1.0", "norm_adv=true", "norm_reward=false"])
    adv, ret = advantages_and_returns(TwoEqualRanks(), normalised, rollout, next_values, ReturnScaler(N, 0.5))
    a = torch.tensor([[2.25], [4.0], [5.0]])
    torch.testing.assert_close(adv, (a - a.mean()) / (a.std(correction=0) + 1e-8))
    torch.testing.assert_close(ret, torch.tensor([[3.25], [4.5], [5.0]]))  # returns stay in reward units

    # norm_reward: discounted returns 1, 2.5, 5.25 (both ranks alike: 6 samples, the same variance)
    scaled = load_config(["gamma=0.5", "gae_lambda=1.0", "norm_adv=false", "norm_reward=true"])
    scaler = ReturnScaler(N, 0.5)
    adv, _ = advantages_and_returns(TwoEqualRanks(), scaled, rollout, next_values, scaler)
    g = torch.tensor([1.0, 2.5, 5.25], dtype=torch.float64)
    assert float(scaler.stats.count) == 6
    torch.testing.assert_close(scaler.stats.var, g.var(correction=0))
    std = math.sqrt(float(g.var(correction=0)) + 1e-8)
    r = torch.tensor([1.0, 2.0, 4.0]) / std
    v = torch.tensor([1.0, 0.5, 0.0, 2.0])
    d = [r[t] + 0.5 * v[t + 1] - v[t] for t in range(3)]
    expected = torch.tensor([d[0] + 0.5 * (d[1] + 0.5 * d[2]), d[1] + 0.5 * d[2], d[2]]).unsqueeze(-1)
    torch.testing.assert_close(adv, expected)


def test_crossed_is_true_at_the_step_that_passes_a_multiple_by_hand():
    from ddprl.algos.common import crossed

    # steps of 16: the step that reaches or passes 40 is 48 (32 < 40 <= 48)
    assert [s for s in range(16, 129, 16) if crossed(s, 16, 40)] == [48, 80, 128]
    assert [s for s in range(1, 6) if crossed(s, 1, 1)] == [1, 2, 3, 4, 5]  # every step
    assert [s for s in range(16, 65, 16) if crossed(s, 16, 16)] == [16, 32, 48, 64]
    assert not any(crossed(s, 16, 0) for s in range(16, 129, 16))  # 0: never


class _Ranks:
    """Two ranks seen from one: ``all_reduce_sum`` adds whether the other rank lacks bf16 units."""

    world_size, device = 2, torch.device("cpu")

    def __init__(self, peer_without: bool):
        self.peer_without = peer_without

    def all_reduce_sum(self, values):
        return {key: value + float(self.peer_without) for key, value in values.items()}


def test_precision_auto_is_bf16_for_convolutional_policies_where_every_rank_has_bf16_units(monkeypatch, caplog):
    import logging

    from ddprl.algos.ppo import loop

    caplog.set_level(logging.INFO, logger="ddprl")
    choose = loop.precision_choice
    monkeypatch.setattr(loop, "bf16_units", lambda device: "AVX512_BF16")
    for given in ("tf32", "bf16", "fp16"):
        assert choose(_Ranks(True), given, "nature_cnn") == given  # as given, nothing said
    assert choose(_Ranks(False), "auto", "mlp") == "fp32" and not caplog.messages  # an MLP: fp32, nothing said
    assert choose(_Ranks(False), "fp32", "mlp") == "fp32" and not caplog.messages
    assert choose(_Ranks(True), "fp32", "cnn") == "fp32"  # as given, with where bf16 would run
    assert (
        caplog.messages[-1]
        == "this cpu has AVX512_BF16: precision=auto or bf16 runs the update in bf16 with fp32 weights"
    )
    assert choose(_Ranks(False), "auto", "nature_cnn") == "bf16"
    assert caplog.messages[-1] == "precision=auto: bf16 (this cpu has AVX512_BF16), with fp32 weights"
    assert choose(_Ranks(True), "auto", "cnn") == "fp32"  # the other rank has none: neither uses bf16
    assert caplog.messages[-1] == "precision=auto: fp32 (1 of 2 ranks have no bf16 units)"
    monkeypatch.setattr(loop, "bf16_units", lambda device: None)
    assert choose(_Ranks(False), "auto", "cnn") == "fp32"
    assert caplog.messages[-1] == "precision=auto: fp32 (no bf16 units on this cpu)"
    said = len(caplog.messages)
    assert choose(_Ranks(False), "fp32", "cnn") == "fp32" and len(caplog.messages) == said  # no units: no hint


def test_precision_auto_is_a_ppo_key_only():
    from ddprl.config import load_config
    from ddprl.errors import UsageError

    assert load_config(["precision=auto"]).precision == "auto"
    assert load_config(["engine=jax", "precision=auto"]).precision == "auto"  # the JAX engine: fp32 either way
    with pytest.raises(UsageError, match="precision='auto' is not one of fp32, tf32, bf16, fp16"):
        load_config(["algo=qmix", "task=lbforaging:Foraging-8x8-2p-2f-coop-v3", "precision=auto"])
    with pytest.raises(UsageError, match="precision='bf8' is not one of auto, fp32, tf32, bf16, fp16"):
        load_config(["precision=bf8"])


@pytest.mark.parametrize("units", ["AMX", None])
def test_precision_auto_reaches_the_loop_as_bf16_or_fp32(tmp_path, monkeypatch, capfd, units):
    """What ``auto`` resolves to is the autocast the rollout and the update are built with."""
    from ddprl.algos.common import autocast_context
    from ddprl.algos.ppo import loop
    from ddprl.prepare import prepare_train
    from ddprl.runtime import launch

    built = []

    def recorded(device, precision):
        built.append(precision)
        return autocast_context(device, precision)

    monkeypatch.setattr(loop, "bf16_units", lambda device: units)
    monkeypatch.setattr(loop, "autocast_context", recorded)
    keys = ["task=snake", "world_size=1", "num_envs=4", "n_steps=4", "batch_size=16", "epochs=1", "steps=16"]
    keys += ["eval_episodes=0", "progress=false", "policy=cnn", "policy_width=4", "policy_depth=1", "compile=false"]
    keys += ["hidden_sizes=[8]", "env_kwargs={grid_size: 5}", "device=cpu", f"run_dir={tmp_path}", "precision=auto"]
    launch(loop.train, prepare_train(keys, None))
    assert built == ["bf16" if units else "fp32"]
    assert ("precision=auto: bf16 (this cpu has AMX), with fp32 weights" in capfd.readouterr().err) == bool(units)
