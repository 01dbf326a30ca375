"""PPO on the JAX engine: environments sharded over the device mesh, one compiled iteration.

:func:`train` is the whole job, read top to bottom: sizes, the initial (or resumed) state laid
out on the mesh, then per iteration one call of the compiled rollout + update
(:mod:`ddprl.algos.ppo_jax.learn`), global metrics, evaluation and checkpoints through the same
:class:`ddprl.run.Run` as the torch engine (one run directory, metrics.jsonl, TensorBoard,
``step_<N>.pt``). Keys and their meaning are the torch PPO's; ``devices`` picks the devices.
"""

from __future__ import annotations

import functools
import logging
import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from ddprl.algos.common import crossed
from ddprl.algos.ppo_jax import networks as nets
from ddprl.algos.ppo_jax.learn import SHARDED, make_evaluator, make_iteration, make_optimizer, normalize, rms_init
from ddprl.errors import UsageError
from ddprl.evaluate import Actor
from ddprl.jax.envs import JaxEnv, make_jax_env
from ddprl.jax.runtime import AXIS
from ddprl.jax.state import from_flat, from_process_local, process_local, to_flat
from ddprl.run import Run
from ddprl.runtime.seeding import Seeds

if TYPE_CHECKING:
    from ddprl.algos.ppo_jax.config import JaxPPOConfig
    from ddprl.jax.runtime import JaxRuntime

log = logging.getLogger("ddprl")


def local_copy(tree: Any) -> Any:
    """This process's copy of replicated arrays (no cross-process transfer)."""
    return jax.tree.map(lambda x: x.addressable_data(0), tree)


def initial_carry(
    env: JaxEnv, cfg: JaxPPOConfig, mesh: Any, num_envs: int, key: jax.Array, env_key: jax.Array
) -> dict[str, Any]:
    """Fresh parameters, optimizer, statistics (replicated) and reset envs (sharded over ``dev``)."""
    k_init, k_train = jax.random.split(key)
    params = nets.init_params(
        k_init,
        int(np.prod(env.obs_shape)),
        env.action_dim,
        list(cfg.hidden_sizes),
        env.discrete,
        cfg.log_std_init,
        cfg.ortho_init,
    )
    replicated = {
        "params": params,
        "opt": make_optimizer(cfg).init(params),
        "obs_rms": rms_init(env.obs_shape),
        "ret_rms": rms_init(()),
        "key": k_train,
    }
    sharded = NamedSharding(mesh, P(AXIS))

    @jax.jit
    def reset(ids):
        state, obs = jax.vmap(lambda i: env.reset(jax.random.fold_in(env_key, i)))(ids)
        return {
            "env": state,
            "obs": obs,
            "ep_return": jnp.zeros(ids.shape, jnp.float32),
            "ep_length": jnp.zeros(ids.shape, jnp.int32),
            "ret_carry": jnp.zeros(ids.shape, jnp.float32),
        }

    per_env = jax.jit(reset, out_shardings=sharded)(global_env_ids(mesh, num_envs))
    return {**jax.device_put(replicated, NamedSharding(mesh, P())), **per_env}


def global_env_ids(mesh: Any, num_envs: int) -> jax.Array:
    """``arange(num_envs)`` sharded over ``dev``: device d holds its envs' global indices."""
    return jax.make_array_from_callback(
        (num_envs,), NamedSharding(mesh, P(AXIS)), lambda idx: np.arange(num_envs, dtype=np.int32)[idx]
    )


def sizes(cfg: JaxPPOConfig, num_devices: int) -> tuple[JaxPPOConfig, int, int]:
    """``cfg`` with ``batch_size`` per device (from ``minibatches``), the global ``num_envs`` and
    the envs of each device; a UsageError for sizes the mesh cannot split."""
    num_envs = cfg.num_envs if cfg.num_envs is not None else num_devices
    if num_envs % num_devices:
        raise UsageError(
            f"num_envs={num_envs} is not divisible by the {num_devices} devices of the mesh; "
            f"num_envs is global, use a multiple of {num_devices} (or set devices=)"
        )
    local_num_envs = num_envs // num_devices
    cfg = cfg.with_minibatches(cfg.n_steps * local_num_envs)  # per device, as batch_size is
    if cfg.batch_size > cfg.n_steps * local_num_envs:
        raise UsageError(
            f"batch_size={cfg.batch_size} is larger than the per-device rollout (num_envs/devices x "
            f"n_steps = {cfg.n_steps * local_num_envs})"
        )
    return cfg, num_envs, local_num_envs


def restore_carry(run: Run, carry: dict[str, Any], mesh: Any, num_devices: int) -> None:
    """A resumed run's state into ``carry``: the replicated entries, and the envs (sharded) when
    as many devices wrote the checkpoint; else the envs restart from seeds of the resume step."""
    if run.resumed:
        restored = {
            name: from_flat(run.state[name], local_copy(carry[name]), name) for name in carry if name not in SHARDED
        }
        carry.update(jax.device_put(restored, NamedSharding(mesh, P())))
    own = run.restore_rank_state()
    if own is not None and run.counters.get("num_devices") == num_devices:
        template = process_local({k: carry[k] for k in SHARDED})
        carry.update(from_process_local(from_flat(own["envs"], template, "envs"), NamedSharding(mesh, P(AXIS))))
    elif run.resumed:
        log.warning(
            "resuming on %d device(s) (checkpoint: %s): envs restart from seeds of step %d",
            num_devices,
            run.counters.get("num_devices"),
            run.step,
        )


def run_eval(
    cfg: JaxPPOConfig, run: Run, evaluate: Callable[..., Any], carry: dict[str, Any], step: int
) -> dict[str, float]:
    """``eval_episodes`` episodes of the policy in ``carry``. Every process runs all episodes on
    its own first device, with the same keys: the same numbers everywhere, no collective."""
    key = jax.random.PRNGKey(Seeds(cfg.seed, rank=0).eval_env())
    if not cfg.eval_deterministic:
        key = jax.random.fold_in(key, step)
    run.eval_progress(0, cfg.eval_episodes)  # one compiled call: the bar just says it evaluates
    returns, lengths = jax.device_get(evaluate(local_copy(carry["params"]), local_copy(carry["obs_rms"]), key))
    run.eval_progress(cfg.eval_episodes, cfg.eval_episodes)
    return {
        "eval/return_mean": float(returns.mean()),
        "eval/return_std": float(returns.std()),
        "eval/return_min": float(returns.min()),
        "eval/return_max": float(returns.max()),
        "eval/length_mean": float(lengths.mean()),
        "eval/episodes": float(len(returns)),
    }


def iteration_metrics(
    out: dict[str, Any], seconds: float, steps: int, effective_batch: int, lr: float
) -> dict[str, float]:
    """An iteration's row from the compiled iteration's (global) metrics ``out``, its time and ``steps``."""
    metrics = {k: float(v) for k, v in out.items() if k not in ("train/episode_return_sum", "train/episodes")}
    if out["train/episodes"] > 0:
        metrics["train/episode_return"] = float(out["train/episode_return_sum"] / out["train/episodes"])
    metrics["time/iteration_s"] = seconds
    metrics["time/global_fps"] = steps / seconds
    metrics["train/effective_batch_size"] = float(effective_batch)
    metrics["train/lr"] = lr
    return metrics


def train(rt: JaxRuntime, cfg: JaxPPOConfig) -> None:
    """Train PPO on ``cfg.task`` for ``cfg.steps`` global agent steps (runs in every JAX process)."""
    # -- sizes: global in, per device derived ------------------------------------------------------
    env = make_jax_env(cfg.task, **cfg.env_kwargs)
    num_devices = rt.num_devices
    cfg, num_envs, local_num_envs = sizes(cfg, num_devices)
    steps_per_iteration = cfg.n_steps * num_envs  # global
    num_iterations = math.ceil(cfg.steps / steps_per_iteration)

    run = Run(rt, cfg)
    # Keys shared by every process (the replicated state must be identical everywhere); per-env
    # randomness comes from the global env index folded in, never from the process or device.
    shared = Seeds(cfg.seed, rank=0)
    carry = initial_carry(
        env,
        cfg,
        rt.mesh,
        num_envs,
        jax.random.PRNGKey(shared.shared(run.step)),
        jax.random.PRNGKey(shared.env(run.step)),
    )
    restore_carry(run, carry, rt.mesh, num_devices)
    start_iteration = run.counters["iteration"] if run.resumed else 0
    iterate = make_iteration(env, cfg, rt.mesh, local_num_envs, carry)
    env_ids = global_env_ids(rt.mesh, num_envs)
    evaluate = make_evaluator(env, cfg, cfg.eval_episodes, cfg.eval_deterministic) if cfg.eval_episodes else None

    def save(step: int, iteration: int, score: float | None) -> None:
        state = {name: to_flat(local_copy(carry[name])) for name in carry if name not in SHARDED}
        own_state = {"envs": to_flat(process_local({k: carry[k] for k in SHARDED}))}
        run.save(step, state, counters={"iteration": iteration, "num_devices": num_devices}, own=own_state, score=score)

    # -- compile once, timed apart from training ---------------------------------------------------
    t0 = time.perf_counter()
    iterate = iterate.lower(carry, env_ids, jnp.float32(cfg.lr)).compile()
    compile_s = time.perf_counter() - t0
    effective_batch = cfg.batch_size * num_devices * cfg.sync_freq
    run_dir = run.open(total_steps=num_iterations * steps_per_iteration)
    log.info(
        "run directory %s | %d process(es), %d %s device(s) x %d envs | effective batch %d | "
        "%d iterations of %d steps | compiled in %.1f s",
        run_dir,
        rt.world_size,
        num_devices,
        rt.platform,
        local_num_envs,
        effective_batch,
        num_iterations,
        steps_per_iteration,
        compile_s,
    )

    global_step = run.step
    for iteration in range(start_iteration, num_iterations):
        lr = cfg.lr * (1.0 - iteration / num_iterations) if cfg.anneal_lr else cfg.lr
        t_start = time.perf_counter()
        with run.split.phase("sync"):  # one program: rollout, update and pmean, the host waiting
            carry, out = iterate(carry, env_ids, jnp.float32(lr))
            out = jax.device_get(local_copy(out))  # waits for the iteration
        seconds = time.perf_counter() - t_start
        global_step += steps_per_iteration
        metrics = iteration_metrics(out, seconds, steps_per_iteration, effective_batch, lr)
        if iteration == start_iteration:
            metrics["time/compile_s"] = compile_s
        last = iteration == num_iterations - 1
        if evaluate is not None and (crossed(global_step, steps_per_iteration, cfg.eval_freq) or last):
            metrics.update(run_eval(cfg, run, evaluate, carry, global_step))
        run.log(global_step, metrics)
        checkpoint_due = crossed(global_step, steps_per_iteration, cfg.checkpoint_freq)
        save_now = functools.partial(save, global_step, iteration + 1)
        run.step_boundary(global_step, save_now, metrics.get("eval/return_mean"), checkpoint_due, last)

    run.finish()  # rank 0 prints the summary block


def load_actor(cfg: JaxPPOConfig, state: dict[str, Any], device: torch.device) -> Actor:
    """The policy of a checkpoint's ``state`` (any device count wrote it), for eval and play."""
    from ddprl.jax.vec import JaxVecEnv

    env = make_jax_env(cfg.task, **cfg.env_kwargs)
    template = nets.init_params(
        jax.random.PRNGKey(0), int(np.prod(env.obs_shape)), env.action_dim, list(cfg.hidden_sizes), env.discrete
    )
    params = from_flat(state["params"], template, "params")
    obs_rms = from_flat(state["obs_rms"], rms_init(env.obs_shape), "obs_rms")
    key = jax.random.PRNGKey(Seeds(cfg.seed, rank=0).eval_actions())

    @jax.jit
    def policy(obs: jax.Array, key: jax.Array) -> jax.Array:
        head = nets.policy_head(params, normalize(obs_rms, obs, cfg.norm_obs), cfg.activation)
        if cfg.eval_deterministic:
            return nets.mode(head, env.discrete)
        return nets.sample(key, params, head, env.discrete)

    draws = iter(range(1 << 62))

    def act(obs: torch.Tensor) -> torch.Tensor:
        action = np.asarray(policy(jnp.asarray(obs.cpu().numpy()), jax.random.fold_in(key, next(draws))))
        return torch.from_numpy(action.copy())

    return Actor(lambda n, seed: JaxVecEnv(env, n, seed), act, ())
