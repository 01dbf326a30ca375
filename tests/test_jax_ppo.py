"""The JAX engine's PPO, in process, on simulated CPU devices (tests/conftest.py sets 4).

The distributed claims: an iteration on N devices, each with its share of the environments,
computes what one device computes on all of them (rollout, statistics, update); parameters are
bit-identical on every device after every optimizer step, with sync_freq 1 and 3; per-env
randomness does not depend on the sharding. And the pieces against the torch engine's.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
from jax.sharding import Mesh  # noqa: E402

from ddprl.algos.ppo_jax import networks as nets  # noqa: E402
from ddprl.algos.ppo_jax.learn import gae, make_iteration, ppo_loss  # noqa: E402
from ddprl.algos.ppo_jax.loop import global_env_ids, initial_carry, local_copy  # noqa: E402
from ddprl.config import load_config  # noqa: E402
from ddprl.jax.envs import make_jax_env  # noqa: E402
from ddprl.jax.runtime import AXIS  # noqa: E402

NUM_ENVS = 8


def mesh_of(n: int) -> Mesh:
    assert len(jax.devices()) >= n, "tests/conftest.py asks for 4 simulated devices"
    return Mesh(np.array(jax.devices()[:n]), (AXIS,))


def config(**keys):
    base = {
        "engine": "jax",
        "task": "gymnax/CartPole-v1",
        "num_envs": NUM_ENVS,
        "n_steps": 16,
        "epochs": 2,
        "world_size": 1,
        "norm_obs": True,
        "norm_reward": True,
        "progress": False,
    }
    return load_config([f"{k}={v}" for k, v in {**base, **keys}.items()])


def compiled_iteration(cfg, n_devices: int, task: str = "gymnax/CartPole-v1"):
    """The iteration on ``n_devices``, its first carry and the envs' global ids."""
    env = make_jax_env(task)
    mesh = mesh_of(n_devices)
    carry = initial_carry(env, cfg, mesh, NUM_ENVS, jax.random.PRNGKey(3), jax.random.PRNGKey(4))
    return make_iteration(env, cfg, mesh, NUM_ENVS // n_devices, carry), carry, global_env_ids(mesh, NUM_ENVS)


def run_iterations(cfg, n_devices: int, iterations: int, task: str = "gymnax/CartPole-v1"):
    iterate, carry, ids = compiled_iteration(cfg, n_devices, task)
    metrics = []
    for _ in range(iterations):
        carry, out = iterate(carry, ids, jnp.float32(cfg.lr))
        metrics.append(jax.device_get(local_copy(out)))
    return carry, metrics


def assert_trees_close(a, b, rtol=2e-5, atol=2e-6):
    for (path, x), y in zip(jax.tree_util.tree_flatten_with_path(a)[0], jax.tree.leaves(b), strict=True):
        np.testing.assert_allclose(
            np.asarray(x), np.asarray(y), rtol=rtol, atol=atol, err_msg=jax.tree_util.keystr(path)
        )


@pytest.mark.parametrize(
    "task,n_devices", [("gymnax/CartPole-v1", 2), ("gymnax/CartPole-v1", 4), ("gymnax/Pendulum-v1", 4)]
)
@pytest.mark.slow
def test_n_shards_equal_one_device(task, n_devices):
    # Each device's share as one minibatch: N devices x (n_steps x 8/N envs) == 1 device x all.
    local = 16 * NUM_ENVS // n_devices
    many, m_many = run_iterations(config(task=task, batch_size=local), n_devices, 2, task)
    one, m_one = run_iterations(config(task=task, batch_size=16 * NUM_ENVS), 1, 2, task)
    host = lambda c: jax.device_get(local_copy({k: c[k] for k in ("params", "opt", "obs_rms", "ret_rms")}))  # noqa: E731
    assert_trees_close(host(many), host(one))
    # The envs themselves: same states and observations whatever the split.
    np.testing.assert_allclose(np.asarray(many["obs"]), np.asarray(one["obs"]), rtol=1e-5, atol=1e-6)
    for a, b in zip(m_many, m_one, strict=True):
        assert a["train/episodes"] == b["train/episodes"]
        np.testing.assert_allclose(a["train/loss"], b["train/loss"], rtol=1e-4, atol=1e-6)
        # The averaged gradient itself (Adam and clipping would hide a gradient N times too large).
        np.testing.assert_allclose(a["train/grad_norm"], b["train/grad_norm"], rtol=1e-4)
    # ...and the update moved the weights (the comparison is not between two initial states).
    fresh = initial_carry(
        make_jax_env(task), config(task=task), mesh_of(1), NUM_ENVS, jax.random.PRNGKey(3), jax.random.PRNGKey(4)
    )
    assert not np.allclose(np.asarray(fresh["params"]["actor"][0]["w"]), np.asarray(one["params"]["actor"][0]["w"]))


def test_sync_freq_accumulates_like_one_big_batch():
    # 2 devices x 4 minibatches of 16, averaged every 4th: one optimizer step per epoch over the
    # whole local rollout == one device with one minibatch of everything.
    many, m_many = run_iterations(config(batch_size=16, sync_freq=4), 2, 2)
    one, m_one = run_iterations(config(batch_size=16 * NUM_ENVS, sync_freq=1), 1, 2)
    assert_trees_close(jax.device_get(local_copy(many["params"])), jax.device_get(local_copy(one["params"])))
    for a, b in zip(m_many, m_one, strict=True):
        np.testing.assert_allclose(a["train/grad_norm"], b["train/grad_norm"], rtol=1e-4)
    with pytest.raises(AssertionError):  # and sync_freq matters: stepping after every minibatch differs
        every, _ = run_iterations(config(batch_size=16, sync_freq=1), 2, 2)
        assert_trees_close(jax.device_get(local_copy(every["params"])), jax.device_get(local_copy(one["params"])))


@pytest.mark.slow
def test_minibatch_advantage_norm_uses_each_steps_global_batch():
    # One optimizer step per epoch over every device's whole rollout (as one minibatch, or as 4
    # accumulated with sync_freq=4): the step's statistics are the rollout's, so
    # norm_adv=minibatch on 2 devices computes what norm_adv=true computes on one device.
    params = lambda c: jax.device_get(local_copy(c["params"]))  # noqa: E731
    one, _ = run_iterations(config(batch_size=16 * NUM_ENVS, norm_adv="true"), 1, 2)
    for batch_size, sync_freq in [(16 * NUM_ENVS // 2, 1), (16, 4)]:
        cfg = config(batch_size=batch_size, sync_freq=sync_freq, norm_adv="minibatch")
        many, _ = run_iterations(cfg, 2, 2)
        assert_trees_close(params(many), params(one))
    # steps of 16 samples per device: each standardised with its own statistics, another update
    per_step, _ = run_iterations(config(batch_size=16, norm_adv="minibatch"), 2, 2)
    per_rollout, _ = run_iterations(config(batch_size=16, norm_adv="true"), 2, 2)
    with pytest.raises(AssertionError):
        assert_trees_close(params(per_step), params(per_rollout))


@pytest.mark.parametrize("sync_freq", [1, 3])
def test_parameters_identical_on_every_device(sync_freq):
    # 4 devices, 8 minibatches per device per epoch (groups of 3, 3 and a shorter 2 when sync_freq=3).
    carry, metrics = run_iterations(config(batch_size=4, sync_freq=sync_freq, epochs=3), 4, 3)
    for path, leaf in jax.tree_util.tree_flatten_with_path(carry["params"])[0]:
        copies = [np.asarray(s.data) for s in leaf.addressable_shards]
        assert len(copies) == 4
        for other in copies[1:]:
            assert np.array_equal(copies[0], other), jax.tree_util.keystr(path)
    assert all(m["train/epochs"] == 3 for m in metrics)


@pytest.mark.parametrize("norm_adv", ["true", "minibatch"])
def test_an_optimizer_step_makes_one_collective_for_its_gradient(norm_adv):
    """The gradient and the loss terms cross devices as one flat vector (a CPU mesh pays per collective);
    norm_adv=minibatch adds one for the advantages' moments."""
    cfg = config(batch_size=16, norm_adv=norm_adv)
    iterate, carry, ids = compiled_iteration(cfg, 2)
    program = jax.make_jaxpr(iterate)(carry, ids, jnp.float32(cfg.lr))

    def reductions(jaxpr, inside):  # (the primitives around it, its operand count) of every psum
        for eqn in jaxpr.eqns:
            if "psum" in eqn.primitive.name:
                yield inside, len(eqn.invars)
            for param in eqn.params.values():
                for sub in param if isinstance(param, (list, tuple)) else [param]:
                    sub = getattr(sub, "jaxpr", sub)
                    if hasattr(sub, "eqns"):
                        yield from reductions(sub, (*inside, eqn.primitive.name))

    # The update: a while loop over epochs, a scan over optimizer steps.
    in_update = [n for inside, n in reductions(program.jaxpr, ()) if "while" in inside and "scan" in inside]
    assert in_update == ([1, 1] if norm_adv == "minibatch" else [1])


def test_target_kl_is_decided_on_the_global_kl():
    cfg = config(batch_size=8, target_kl=1e-9, epochs=5)
    carry, metrics = run_iterations(cfg, 4, 2)
    assert [m["train/epochs"] for m in metrics] == [1.0, 1.0]  # stopped after the first epoch, everywhere
    one, m_one = run_iterations(config(batch_size=8, target_kl=1e6, epochs=5), 4, 1)
    assert m_one[0]["train/epochs"] == 5.0


def test_env_sharding_gives_every_env_its_own_seed():
    env = make_jax_env("gymnax/CartPole-v1")
    first = {}
    for n in (1, 2, 4):
        carry = initial_carry(env, config(), mesh_of(n), NUM_ENVS, jax.random.PRNGKey(0), jax.random.PRNGKey(1))
        first[n] = np.asarray(carry["obs"])
        per_device = [np.asarray(s.data) for s in carry["obs"].addressable_shards]
        assert len(per_device) == n and all(len(p) == NUM_ENVS // n for p in per_device)
    assert len({tuple(row) for row in first[4]}) == NUM_ENVS  # 8 distinct initial states
    assert np.array_equal(first[1], first[2]) and np.array_equal(first[1], first[4])


def test_gae_matches_the_torch_engine():
    from ddprl.algos.ppo.rollout import Rollout, compute_gae

    rng = np.random.default_rng(0)
    T, N = 7, 3
    data = {
        "reward": rng.normal(size=(T, N)).astype(np.float32),
        "value": rng.normal(size=(T, N)).astype(np.float32),
        "final_value": rng.normal(size=(T, N)).astype(np.float32),
        "terminated": rng.random((T, N)) < 0.2,
        "truncated": rng.random((T, N)) < 0.2,
    }
    data["truncated"] &= ~data["terminated"]
    nxt = rng.normal(size=N).astype(np.float32)
    adv, ret = gae({k: jnp.asarray(v) for k, v in data.items()}, jnp.asarray(nxt), 0.9, 0.8)
    t = {k: torch.from_numpy(v) for k, v in data.items()}
    rollout = Rollout(
        obs=None,
        actions=None,
        log_probs=None,
        values=t["value"],
        rewards=t["reward"],
        terminated=t["terminated"],
        truncated=t["truncated"],
        final_values=t["final_value"],
    )
    t_adv, t_ret = compute_gae(rollout, torch.from_numpy(nxt), 0.9, 0.8)
    np.testing.assert_allclose(np.asarray(adv), t_adv.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(ret), t_ret.numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("discrete", [True, False])
def test_loss_and_distributions_match_the_torch_engine(discrete):
    from ddprl.algos.ppo.loss import ppo_loss as torch_loss
    from ddprl.algos.ppo.networks import PolicyOutput

    cfg = config(ent_coef=0.01)
    rng = np.random.default_rng(1)
    B, A = 32, 3
    params = nets.init_params(jax.random.PRNGKey(0), 4, A, [8], discrete)
    if not discrete:
        params["log_std"] = jnp.asarray(rng.normal(size=A).astype(np.float32) * 0.3)
    obs = rng.normal(size=(B, 4)).astype(np.float32)
    action = rng.integers(0, A, B) if discrete else rng.normal(size=(B, A)).astype(np.float32)
    mb = {
        "obs": jnp.asarray(obs),
        "action": jnp.asarray(action),
        "log_prob": jnp.asarray(rng.normal(size=B).astype(np.float32) - 1.0),
        "value": jnp.asarray(rng.normal(size=B).astype(np.float32)),
        "advantage": jnp.asarray(rng.normal(size=B).astype(np.float32)),
        "return": jnp.asarray(rng.normal(size=B).astype(np.float32)),
    }
    head = torch.from_numpy(np.array(nets.policy_head(params, mb["obs"])))
    if discrete:
        dist = torch.distributions.Categorical(logits=head)
        t_action = torch.from_numpy(action)
        logp, ent = dist.log_prob(t_action), dist.entropy()
    else:
        dist = torch.distributions.Normal(head, torch.from_numpy(np.exp(np.asarray(params["log_std"]))).expand_as(head))
        t_action = torch.from_numpy(action)
        logp, ent = dist.log_prob(t_action).sum(-1), dist.entropy().sum(-1)
    out = PolicyOutput(t_action, logp, ent, torch.from_numpy(np.array(nets.value(params, mb["obs"]))))
    expected = torch_loss(
        out,
        *(torch.from_numpy(np.array(mb[k])) for k in ("log_prob", "value", "advantage", "return")),
        cfg.clip_coef,
        cfg.clip_vloss,
        cfg.vf_coef,
        cfg.ent_coef,
    )
    _, terms = ppo_loss(params, mb, cfg, discrete)
    for name in ("loss", "policy_loss", "value_loss", "entropy", "approx_kl", "clip_frac"):
        np.testing.assert_allclose(float(terms[name]), float(expected[name]), rtol=1e-5, atol=1e-6, err_msg=name)


def test_init_keys_draw_as_the_torch_engine_does():
    """``log_std_init`` and ``ortho_init=false`` on the JAX engine: the log std starts there, and
    weights and biases are spread as torch's nn.Linear draws them (uniform in +-1/sqrt(fan_in))."""
    ortho = nets.init_params(jax.random.PRNGKey(0), 256, 3, [256], False)
    plain = nets.init_params(jax.random.PRNGKey(0), 256, 3, [256], False, log_std_init=-2.0, ortho_init=False)
    np.testing.assert_array_equal(np.asarray(plain["log_std"]), np.full(3, -2.0, np.float32))
    np.testing.assert_array_equal(np.asarray(ortho["log_std"]), np.zeros(3, np.float32))
    torch.manual_seed(0)
    reference = torch.nn.Linear(256, 256)
    for name, torch_std in (("w", reference.weight.std().item()), ("b", reference.bias.std().item())):
        drawn = np.asarray(plain["critic"][0][name])
        assert np.abs(drawn).max() <= 1 / 16 and abs(drawn.std() / torch_std - 1) < 0.1, name
    w = np.asarray(ortho["critic"][0]["w"])
    assert abs(w.std() / reference.weight.std().item() - 1) > 0.5  # orthogonal (gain sqrt 2) is spread wider
    assert not np.asarray(ortho["critic"][0]["b"]).any()


@pytest.mark.parametrize("activation", ["tanh", "relu"])
def test_networks_compute_what_the_torch_engine_computes(activation):
    """The same weights give the same logits and values on both engines, for either activation
    (the key PureJaxRL's configurations call ACTIVATION)."""
    import gymnasium as gym

    from ddprl.algos.ppo.networks import ActorCritic

    torch.manual_seed(0)
    net = ActorCritic(gym.spaces.Box(-1, 1, (5,)), gym.spaces.Discrete(3), hidden_sizes=[16, 8], activation=activation)
    params = nets.init_params(jax.random.PRNGKey(0), 5, 3, [16, 8], True)

    def copied(seq):  # torch Linear layers (out, in) -> the JAX layers' (in, out)
        linear = [m for m in seq if hasattr(m, "weight")]
        return [
            {"w": jnp.asarray(m.weight.detach().T.numpy()), "b": jnp.asarray(m.bias.detach().numpy())} for m in linear
        ]

    params = {"actor": copied(net.actor), "critic": copied(net.critic)}
    obs = np.random.default_rng(0).normal(size=(7, 5)).astype(np.float32) * 2
    with torch.no_grad():
        logits = net.actor(torch.from_numpy(obs)).numpy()
        values = net.value(torch.from_numpy(obs)).numpy()
    np.testing.assert_allclose(np.asarray(nets.policy_head(params, jnp.asarray(obs), activation)), logits, atol=1e-5)
    np.testing.assert_allclose(np.asarray(nets.value(params, jnp.asarray(obs), activation)), values, atol=1e-5)
    other = "relu" if activation == "tanh" else "tanh"  # the check can fail: the other activation differs
    assert not np.allclose(np.asarray(nets.value(params, jnp.asarray(obs), other)), values, atol=1e-3)


def test_adam_steps_with_the_learning_rate_the_iteration_is_given():
    """The loop anneals the learning rate on the host and hands it to each iteration: at 0 the
    parameters stay as they were (the statistics still move), at the configured rate they move."""
    cfg = config(max_grad_norm=0.5, batch_size=32)  # 2 minibatches a device and epoch
    iterate, carry, ids = compiled_iteration(cfg, 2)
    before = jax.device_get(local_copy(carry["params"]))
    frozen, _ = iterate(carry, ids, jnp.float32(0.0))
    for a, b in zip(
        jax.tree.leaves(before), jax.tree.leaves(jax.device_get(local_copy(frozen["params"]))), strict=True
    ):
        np.testing.assert_array_equal(a, b)
    assert float(jax.device_get(local_copy(frozen["obs_rms"]))["count"]) == NUM_ENVS * cfg.n_steps
    iterate, carry, ids = compiled_iteration(cfg, 2)
    moved, _ = iterate(carry, ids, jnp.float32(cfg.lr))
    diff = max(
        float(np.abs(a - b).max())
        for a, b in zip(
            jax.tree.leaves(before), jax.tree.leaves(jax.device_get(local_copy(moved["params"]))), strict=True
        )
    )
    assert diff > 1e-5
