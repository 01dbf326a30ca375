"""One PPO iteration as one compiled program: rollout, GAE, update — sharded over the device mesh.

:func:`make_iteration` returns ``iteration(carry, env_ids, lr) -> (carry, metrics)``, a
``jax.jit`` of a ``jax.shard_map`` over the mesh axis ``dev``. Inside, each device sees only its
own environments (``carry`` entries of :data:`SHARDED`) and a replica of everything else.
Collectives, all over ``dev``, all where the torch engine has an all-reduce:

- gradients: ``pmean`` once every ``sync_freq`` minibatches (accumulated locally in between);
- advantage normalisation (of the rollout, or of each optimizer step's minibatches):
  ``pmean`` of the moments; observation and return statistics: ``psum`` of centred moments
  (:func:`global_moments`);
- the ``target_kl`` early stop: decided on the ``pmean`` of the epoch's KL, so every device
  runs the same number of epochs (a per-device decision would desynchronise the replicas);
- metrics: ``pmean``/``psum`` (``train/grad_norm``: the averaged gradient's norm before clipping).

Randomness is keyed by the *global* env index (``env_ids``), so a rollout does not depend on
how the envs are split over devices: N devices on N shares compute what one device computes
on all the envs (tested). ``check_vma=True`` (gymnax tasks) lets JAX verify that everything declared
replicated really is; parameters are cast to "varying" before differentiating so that
``jax.grad`` returns each device's own gradient (with invariant parameters it would already
sum over devices, and the ``pmean`` after it would then give N times the gradient).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax import lax
from jax.flatten_util import ravel_pytree
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from ddprl.algos.ppo_jax import networks as nets
from ddprl.jax.envs import JaxEnv
from ddprl.jax.runtime import AXIS

if TYPE_CHECKING:
    from ddprl.algos.ppo_jax.config import JaxPPOConfig

# Carry entries that hold one row per environment (sharded over devices); the rest is replicated.
SHARDED = ("env", "obs", "ep_return", "ep_length", "ret_carry")
# optax >= 0.2.5 has optax.tree.norm (global_norm is deprecated there); older ones only global_norm
_tree_norm = getattr(getattr(optax, "tree", None), "norm", None) or optax.global_norm
TERMS = ("loss", "policy_loss", "value_loss", "entropy", "approx_kl", "clip_frac")  # ppo_loss's metrics
OBS_CLIP = 10.0
EPS = 1e-8


def carry_specs(carry: dict[str, Any]) -> dict[str, P]:
    return {k: P(AXIS) if k in SHARDED else P() for k in carry}


def _varying(tree: Any) -> Any:
    """Mark values as per-device (needed under ``check_vma=True`` only)."""
    return jax.tree.map(lambda x: lax.pcast(x, AXIS, to="varying"), tree)


def _same(tree: Any) -> Any:
    return tree


# -- running statistics (the torch engine's RunningMeanStd, centred moments merged over devices)
def rms_init(shape: tuple[int, ...]) -> dict[str, jax.Array]:
    return {
        "mean": jnp.zeros(shape, jnp.float32),
        "var": jnp.ones(shape, jnp.float32),
        "count": jnp.zeros((), jnp.float32),
    }


def global_moments(x: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Count, mean and M2 (sum of squared deviations from the mean) of the rows of ``x`` on every
    device, replicated; ``x`` (n, *shape) is this device's share.

    Centred moments, because E[x^2] - mean^2 in float32 cancels to nothing when the mean is
    large against the spread (1e4 + N(0, 1) gives a variance of 0). Each device sums in a frame
    shifted by its first row, so that its mean and M2 add values of the spread's size (how
    accurately a float32 sum of many large values comes out depends on XLA's reduction order);
    the merge over devices is Chan et al.'s, written as sums of non-negative terms so that
    ``psum`` cancels nothing: M2 = sum_d [M2_d + n_d (mean_d - mean)^2].
    """
    n_local = jnp.float32(x.shape[0])
    shift = x[0]
    d = x - shift
    d_mean = d.mean(0)
    m2_local = ((d - d_mean) ** 2).sum(0)
    mean_local = shift + d_mean
    n, weighted = lax.psum((n_local, n_local * mean_local), AXIS)
    mean = weighted / n
    m2 = lax.psum(m2_local + n_local * (mean_local - mean) ** 2, AXIS)
    return n, mean, m2


def rms_update(rms: dict[str, jax.Array], x: jax.Array) -> dict[str, jax.Array]:
    """Merge the samples of ``x`` (rows over every device) into ``rms`` (Chan et al.)."""
    n, batch_mean, batch_m2 = global_moments(x.reshape((-1, *rms["mean"].shape)))
    delta = batch_mean - rms["mean"]
    total = rms["count"] + n
    m2 = rms["var"] * rms["count"] + batch_m2 + delta**2 * (rms["count"] * n / total)
    return {"mean": rms["mean"] + delta * (n / total), "var": m2 / total, "count": total}


def normalize(rms: dict[str, jax.Array], x: jax.Array, enabled: bool) -> jax.Array:
    if not enabled:
        return x
    return jnp.clip((x - rms["mean"]) / jnp.sqrt(rms["var"] + EPS), -OBS_CLIP, OBS_CLIP)


# -- the pieces of an iteration ------------------------------------------------------------------
def make_optimizer(cfg: JaxPPOConfig) -> optax.GradientTransformation:
    """Adam (eps 1e-5, as the torch engine) after a global-norm clip; lr injectable for annealing."""
    adam = optax.inject_hyperparams(optax.adam)(learning_rate=cfg.lr, eps=1e-5)
    return optax.chain(optax.clip_by_global_norm(cfg.max_grad_norm), adam) if cfg.max_grad_norm > 0 else adam


def _with_lr(opt_state: Any, lr: jax.Array) -> Any:
    """``opt_state`` with Adam's learning rate set to ``lr`` (annealed on the host)."""
    if hasattr(opt_state, "hyperparams"):
        return opt_state._replace(hyperparams={**opt_state.hyperparams, "learning_rate": lr})
    return (*opt_state[:-1], _with_lr(opt_state[-1], lr))  # a chain: Adam is the last transformation


def gae(rollout: dict[str, jax.Array], next_values: jax.Array, gamma: float, lam: float) -> tuple[jax.Array, jax.Array]:
    """Truncation-aware GAE, (T, n) each: ``ddprl.algos.ppo.rollout.compute_gae`` in a reverse scan."""
    following = jnp.concatenate([rollout["value"][1:], next_values[None]], axis=0)
    bootstrap = jnp.where(rollout["truncated"], rollout["final_value"], following)
    not_terminated = 1.0 - rollout["terminated"].astype(jnp.float32)
    delta = rollout["reward"] + gamma * bootstrap * not_terminated - rollout["value"]
    not_done = 1.0 - (rollout["terminated"] | rollout["truncated"]).astype(jnp.float32)

    def back(last, xs):
        d, nd = xs
        last = d + gamma * lam * nd * last
        return last, last

    _, advantages = lax.scan(back, jnp.zeros_like(next_values), (delta, not_done), reverse=True)
    return advantages, advantages + rollout["value"]


def standardize(advantages: jax.Array) -> jax.Array:
    """``(a - mean) / (std + EPS)`` with the mean and (population) std over every device's
    ``advantages`` (equal shares: the ``pmean`` of the means is the global mean); inside the
    ``shard_map`` only. The torch engine's ``ddprl.algos.ppo.loss.standardize``."""
    mean, mean_sq = lax.pmean(jnp.stack([advantages.mean(), (advantages**2).mean()]), AXIS)  # one collective
    return (advantages - mean) / (jnp.sqrt(jnp.maximum(mean_sq - mean**2, 0.0)) + EPS)


def ppo_loss(params: nets.Params, mb: dict[str, jax.Array], cfg: JaxPPOConfig, discrete: bool):
    """The torch engine's ``ppo_loss`` (clipped surrogate, clipped value loss, entropy bonus)."""
    head = nets.policy_head(params, mb["obs"], cfg.activation)
    log_prob, entropy = nets.log_prob_entropy(params, head, mb["action"], discrete)
    value = nets.value(params, mb["obs"], cfg.activation)
    log_ratio = log_prob - mb["log_prob"]
    ratio = jnp.exp(log_ratio)
    adv = mb["advantage"]
    pg_loss = jnp.maximum(-adv * ratio, -adv * jnp.clip(ratio, 1 - cfg.clip_coef, 1 + cfg.clip_coef)).mean()
    if cfg.clip_vloss:
        v_clipped = mb["value"] + jnp.clip(value - mb["value"], -cfg.clip_coef, cfg.clip_coef)
        v_loss = 0.5 * jnp.maximum((value - mb["return"]) ** 2, (v_clipped - mb["return"]) ** 2).mean()
    else:
        v_loss = 0.5 * ((value - mb["return"]) ** 2).mean()
    ent = entropy.mean()
    ratio_ng, log_ratio_ng = lax.stop_gradient(ratio), lax.stop_gradient(log_ratio)
    terms = {
        "policy_loss": pg_loss,
        "value_loss": v_loss,
        "entropy": ent,
        "approx_kl": ((ratio_ng - 1) - log_ratio_ng).mean(),
        "clip_frac": (jnp.abs(ratio_ng - 1) > cfg.clip_coef).astype(jnp.float32).mean(),
    }
    loss = pg_loss - cfg.ent_coef * ent + cfg.vf_coef * v_loss
    return loss, {"loss": lax.stop_gradient(loss), **terms}


class IterationPlan(NamedTuple):
    """What the pieces of one compiled iteration share: the config, the env, the optimizer and the
    sizes of one device's share (built by :func:`make_iteration`)."""

    cfg: JaxPPOConfig
    env: JaxEnv
    tx: optax.GradientTransformation
    low: jax.Array | None  # continuous actions: the env's bounds (actions are clipped to them)
    high: jax.Array | None
    n_local: int  # samples of one device's rollout
    num_minibatches: int  # per epoch, on each device
    full_groups: int  # optimizer steps of sync_freq minibatches per epoch
    rest: int  # minibatches of a shorter last group (0: none)
    varying: Callable[[Any], Any]  # marks values per device where JAX checks replication


def rollout(
    plan: IterationPlan, c: dict[str, Any], env_ids: jax.Array, key: jax.Array
) -> tuple[dict[str, Any], dict[str, jax.Array], jax.Array, jax.Array]:
    """``n_steps`` in each of this device's envs: the carry after them, the rollout (T, n) and the
    return sum and count of the episodes that ended."""
    cfg, env, discrete = plan.cfg, plan.env, plan.env.discrete
    params, obs_rms = c["params"], c["obs_rms"]

    def one_step(s, t):
        env_state, obs, ep_return, ep_length, ret_sum, ret_count = s
        # One key per global env and step: the same draws however the envs are sharded.
        keys = jax.vmap(lambda i: jax.random.split(jax.random.fold_in(jax.random.fold_in(key, t), i)))(env_ids)
        nobs = normalize(obs_rms, obs, cfg.norm_obs)
        head = nets.policy_head(params, nobs, cfg.activation)
        value = nets.value(params, nobs, cfg.activation)
        action = jax.vmap(lambda kk, h: nets.sample(kk, params, h[None], discrete)[0])(keys[:, 0], head)
        log_prob, _ = nets.log_prob_entropy(params, head, action, discrete)
        env_action = action if discrete else jnp.clip(action, plan.low, plan.high)
        env_state, next_obs, reward, terminated, truncated, final_obs = jax.vmap(env.step)(
            keys[:, 1], env_state, env_action
        )
        final_value = nets.value(params, normalize(obs_rms, final_obs, cfg.norm_obs), cfg.activation)
        ep_return, ep_length = ep_return + reward, ep_length + 1
        done = terminated | truncated
        ret_sum = ret_sum + jnp.where(done, ep_return, 0.0).sum()
        ret_count = ret_count + done.sum()
        ep_return, ep_length = jnp.where(done, 0.0, ep_return), jnp.where(done, 0, ep_length)
        step = {
            "obs": obs,
            "action": action,
            "log_prob": log_prob,
            "value": value,
            "reward": reward,
            "terminated": terminated,
            "truncated": truncated,
            "final_value": final_value,
        }
        return (env_state, next_obs, ep_return, ep_length, ret_sum, ret_count), step

    zero = plan.varying(jnp.zeros((), jnp.float32))
    init = (c["env"], c["obs"], c["ep_return"], c["ep_length"], zero, zero)
    (env_state, obs, ep_return, ep_length, ret_sum, ret_count), data = lax.scan(one_step, init, jnp.arange(cfg.n_steps))
    c = {**c, "env": env_state, "obs": obs, "ep_return": ep_return, "ep_length": ep_length}
    return c, data, ret_sum, ret_count


def learn(
    plan: IterationPlan, params: Any, opt_state: Any, batch: dict[str, jax.Array], key: jax.Array
) -> tuple[Any, Any, dict[str, jax.Array]]:
    """``epochs`` passes over this device's ``batch`` (fewer when the ``target_kl`` early stop,
    decided on the KL averaged over devices, ends them): the new parameters and optimizer state,
    and the mean loss terms."""
    cfg, discrete, varying = plan.cfg, plan.env.discrete, plan.varying
    k, full_groups, rest, num_minibatches = cfg.sync_freq, plan.full_groups, plan.rest, plan.num_minibatches
    optimizer_steps_per_epoch = full_groups + (1 if rest else 0)

    def group(state, idx):  # idx (g, batch_size): one optimizer step from g minibatches
        params, opt_state, sums = state
        g = idx.shape[0]
        mine = varying(params)  # this device's gradient, not the implicit sum (module docstring)
        advantages = batch["advantage"][idx]  # (g, batch_size)
        if cfg.norm_adv == "minibatch":  # over the optimizer step's global batch, as the torch engine
            advantages = standardize(advantages)

        def accumulate(acc, xs):
            i, adv = xs
            mb = {**jax.tree.map(lambda x: x[i], batch), "advantage": adv}
            (_, terms), grads = jax.value_and_grad(ppo_loss, has_aux=True)(mine, mb, cfg, discrete)
            grads_sum, term_sums = acc
            return (
                jax.tree.map(lambda a, b: a + b / g, grads_sum, grads),
                jax.tree.map(jnp.add, term_sums, terms),
            ), None

        term_zeros = {name: jnp.zeros((), jnp.float32) for name in TERMS}
        zeros = (jax.tree.map(jnp.zeros_like, mine), varying(term_zeros))
        (grads, term_sums), _ = lax.scan(accumulate, zeros, (idx, advantages))
        # The one collective of this optimizer step, gradient and loss terms in one flat vector: XLA's CPU
        # backend runs a pmean per leaf, each costing tens of microseconds between devices.
        flat, unravel = ravel_pytree((grads, term_sums))
        grads, term_means = unravel(lax.pmean(flat, AXIS))
        updates, opt_state = plan.tx.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        sums = {name: sums[name] + v for name, v in term_means.items()}
        sums["grad_norm"] = state[2]["grad_norm"] + _tree_norm(grads)  # before clipping
        return (params, opt_state, sums), None

    def epoch(state):
        params, opt_state, sums, e, _ = state
        perm_key = jax.random.fold_in(jax.random.fold_in(key, e), lax.axis_index(AXIS))
        idx = jax.random.permutation(perm_key, plan.n_local)[: num_minibatches * cfg.batch_size]
        idx = idx.reshape(num_minibatches, cfg.batch_size)
        kl_before = sums["approx_kl"]
        inner = (params, opt_state, sums)
        if full_groups:
            inner, _ = lax.scan(group, inner, idx[: full_groups * k].reshape(full_groups, k, cfg.batch_size))
        if rest:  # a shorter last group, as the torch engine
            inner, _ = group(inner, idx[full_groups * k :])
        params, opt_state, sums = inner
        epoch_kl = (sums["approx_kl"] - kl_before) / num_minibatches  # already averaged over devices
        stop = (epoch_kl > cfg.target_kl) if cfg.target_kl is not None else jnp.bool_(False)
        return params, opt_state, sums, e + 1, stop

    def more(state):
        return (state[3] < cfg.epochs) & ~state[4]

    sums = {name: jnp.zeros((), jnp.float32) for name in (*TERMS, "grad_norm")}
    params, opt_state, sums, epochs, _ = lax.while_loop(
        more, epoch, (params, opt_state, sums, jnp.int32(0), jnp.bool_(False))
    )
    grad_norm = sums.pop("grad_norm")
    metrics = {f"train/{name}": v / (epochs * num_minibatches) for name, v in sums.items()}
    metrics["train/grad_norm"] = grad_norm / (epochs * optimizer_steps_per_epoch)
    metrics["train/epochs"] = epochs.astype(jnp.float32)
    return params, opt_state, metrics


def scale_rewards(cfg: JaxPPOConfig, c: dict[str, Any], data: dict[str, jax.Array]) -> tuple[dict[str, Any], jax.Array]:
    """``norm_reward``: the rollout's rewards in units of the discounted return's std, clipped;
    statistics first (this rollout's discounted returns over every device), then the scaling."""

    def track(g, xs):
        r, d = xs
        g = cfg.gamma * g + r
        return g * (1.0 - d), g

    dones = (data["terminated"] | data["truncated"]).astype(jnp.float32)
    ret_carry, returns = lax.scan(track, c["ret_carry"], (data["reward"], dones))
    ret_rms = rms_update(c["ret_rms"], returns)
    rewards = jnp.clip(data["reward"] / jnp.sqrt(ret_rms["var"] + EPS), -OBS_CLIP, OBS_CLIP)
    return {**c, "ret_carry": ret_carry, "ret_rms": ret_rms}, rewards


def iteration(
    plan: IterationPlan, c: dict[str, Any], env_ids: jax.Array, lr: jax.Array
) -> tuple[dict[str, Any], dict[str, jax.Array]]:
    """One PPO iteration on this device's share (inside the ``shard_map``): rollout, GAE, update."""
    cfg, n_local = plan.cfg, plan.n_local
    key, k_rollout, k_learn = jax.random.split(c["key"], 3)
    c = {**c, "key": key, "opt": _with_lr(c["opt"], lr)}
    c, data, ret_sum, ret_count = rollout(plan, c, env_ids, k_rollout)
    next_values = nets.value(c["params"], normalize(c["obs_rms"], c["obs"], cfg.norm_obs), cfg.activation)
    rewards = data["reward"]
    if cfg.norm_reward:
        c, rewards = scale_rewards(cfg, c, data)
    advantages, returns = gae({**data, "reward": rewards}, next_values, cfg.gamma, cfg.gae_lambda)
    if cfg.norm_adv is True:  # with the mean/std of every device's rollout (the global batch)
        advantages = standardize(advantages)
    flat = lambda x: x.reshape((n_local, *x.shape[2:]))  # noqa: E731
    batch = {
        "obs": flat(normalize(c["obs_rms"], data["obs"], cfg.norm_obs)),
        "action": flat(data["action"]),
        "log_prob": flat(data["log_prob"]),
        "value": flat(data["value"]),
        "advantage": flat(advantages),
        "return": flat(returns),
    }
    params, opt, metrics = learn(plan, c["params"], c["opt"], batch, k_learn)
    c = {**c, "params": params, "opt": opt}
    if cfg.norm_obs:  # after the update: rollout and update used the same statistics
        c["obs_rms"] = rms_update(c["obs_rms"], data["obs"])
    ret_sum, ret_count = lax.psum((ret_sum, ret_count), AXIS)
    metrics["train/episode_return_sum"] = ret_sum
    metrics["train/episodes"] = ret_count
    return c, metrics


def make_iteration(
    env: JaxEnv, cfg: JaxPPOConfig, mesh: Any, local_num_envs: int, carry_template: dict[str, Any]
) -> Callable[..., tuple[dict[str, Any], dict[str, jax.Array]]]:
    """The compiled PPO iteration for ``mesh`` (see the module docstring)."""
    n_local = cfg.n_steps * local_num_envs
    num_minibatches = n_local // cfg.batch_size
    full_groups, rest = divmod(num_minibatches, cfg.sync_freq)
    # JAX checks the replication of every value where the env's code allows it (gymnax); MJX
    # mixes replicated model constants into per-device branches in a way the check rejects, so
    # brax tasks run unchecked (there jax.grad gives each device's own gradient without a cast).
    check_vma = env.check_vma
    plan = IterationPlan(
        cfg=cfg,
        env=env,
        tx=make_optimizer(cfg),
        low=None if env.discrete else jnp.asarray(env.action_low),
        high=None if env.discrete else jnp.asarray(env.action_high),
        n_local=n_local,
        num_minibatches=num_minibatches,
        full_groups=full_groups,
        rest=rest,
        varying=_varying if check_vma else _same,
    )
    specs = carry_specs(carry_template)
    sharded = jax.shard_map(
        functools.partial(iteration, plan),
        mesh=mesh,
        in_specs=(specs, P(AXIS), P()),
        out_specs=(specs, P()),
        check_vma=check_vma,
    )
    # Shardings pinned on the way out too: XLA otherwise reports zero-size leaves (MJX's empty
    # mocap arrays) as replicated, and the next call's arguments would not match the program.
    shardings = {name: NamedSharding(mesh, spec) for name, spec in specs.items()}
    return jax.jit(
        sharded,
        in_shardings=(shardings, NamedSharding(mesh, P(AXIS)), NamedSharding(mesh, P())),
        out_shardings=(shardings, NamedSharding(mesh, P())),
        donate_argnums=(0,),
    )


def make_evaluator(env: JaxEnv, cfg: JaxPPOConfig, episodes: int, deterministic: bool) -> Callable[..., Any]:
    """``evaluate(params, obs_rms, key) -> (returns, lengths)`` of ``episodes`` envs run to their end."""
    discrete = env.discrete
    low = None if discrete else jnp.asarray(env.action_low)
    high = None if discrete else jnp.asarray(env.action_high)

    def run(params, obs_rms, key):
        state, obs = jax.vmap(env.reset)(jax.random.split(key, episodes))

        def one_step(s, t):
            state, obs, ret, length, alive = s
            keys = jax.random.split(jax.random.fold_in(key, t + 1), 2 * episodes).reshape(episodes, 2, -1)
            head = nets.policy_head(params, normalize(obs_rms, obs, cfg.norm_obs), cfg.activation)
            if deterministic:
                action = nets.mode(head, discrete)
            else:
                action = jax.vmap(lambda kk, h: nets.sample(kk, params, h[None], discrete)[0])(keys[:, 0], head)
            if not discrete:
                action = jnp.clip(action, low, high)
            state, obs, reward, terminated, truncated, _ = jax.vmap(env.step)(keys[:, 1], state, action)
            ret = ret + jnp.where(alive, reward, 0.0)
            length = length + alive.astype(jnp.int32)
            alive = alive & ~(terminated | truncated)
            return (state, obs, ret, length, alive), None

        init = (state, obs, jnp.zeros(episodes), jnp.zeros(episodes, jnp.int32), jnp.ones(episodes, bool))
        (_, _, ret, length, _), _ = lax.scan(one_step, init, jnp.arange(env.max_episode_steps))
        return ret, length

    return jax.jit(run)
