"""PPO with data parallelism: every rank collects its own rollout, one model learns from all of them.

The whole algorithm is :func:`train`, read top to bottom: a rollout (``rollout.RolloutStep``),
GAE, the update (``update.learn`` around one ``update.UpdateStep``), bookkeeping. The rollout
step and the optimizer step are each one function, run eagerly or, with ``compile=true``, as
compiled regions (:func:`plan`). None of it touches the process group: collectives go
through the runtime ``rt``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import math
import os
import shutil
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

import torch

from ddprl.algos.common import autocast_context, crossed
from ddprl.algos.graphs import training_step_unsupported
from ddprl.algos.ppo.loss import standardize
from ddprl.algos.ppo.networks import ActorCritic
from ddprl.algos.ppo.rollout import (
    Rollout,
    RolloutBuffer,
    RolloutStep,
    acts_jointly,
    compute_gae,
    obs_storage_dtype,
)
from ddprl.algos.ppo.update import UpdateStep, learn, update_batch
from ddprl.checkpoint import Stateful, state_of
from ddprl.envs import atari, make_env
from ddprl.envs.base import VecEnv
from ddprl.evaluate import Actor
from ddprl.normalize import ReturnScaler, RunningMeanStd
from ddprl.run import Run
from ddprl.runtime.placement import Placement, beside_cores, rank_cores
from ddprl.runtime.seeding import Seeds
from ddprl.system import bf16_units, system_metrics

if TYPE_CHECKING:
    from ddprl.algos.ppo.config import PPOConfig
    from ddprl.runtime.collectives import Runtime

log = logging.getLogger("ddprl")


# compile=auto compiles from this many optimizer steps on: on a CPU core an MLP update runs 3.3x (HalfCheetah) to 4.2x
# (CartPole) faster compiled after 10 to 50 s of compiling (docs/benchmarks.md), which 20,000 steps about repay
COMPILE_AUTO = 50_000


def norm_obs_mask(env: Any) -> torch.Tensor | None:
    """The observation columns ``norm_obs`` rescales: those of Box parts (a Gymnasium env's
    ``norm_obs_mask``, as SB3 normalises Box observations only); None: all."""
    mask = getattr(env, "norm_obs_mask", None)  # only envs that encode observations have one
    return None if mask is None else torch.as_tensor(mask)


def build_agent(cfg: PPOConfig, env: VecEnv) -> ActorCritic:
    return ActorCritic(
        env.single_observation_space,
        env.single_action_space,
        policy=cfg.policy,
        hidden_sizes=list(cfg.hidden_sizes),
        policy_width=cfg.policy_width,
        policy_depth=cfg.policy_depth,
        activation=cfg.activation,
        log_std_init=cfg.log_std_init,
        ortho_init=cfg.ortho_init,
    )


class Plan(NamedTuple):
    """What ``compile=true`` runs as compiled regions in this job."""

    update: bool  # the optimizer step as one graph (else eagerly, on the compiled model)
    unroll: int  # env steps per rollout graph (0: the env steps eagerly, the policy is compiled)


def steps_per_call(cfg: PPOConfig, env: VecEnv) -> int:
    """Env steps per call of the rollout step: for an env whose step traces, the largest divisor
    of ``n_steps`` not above ``compile_unroll`` (every call runs the same graph); else 1."""
    if not getattr(env, "traceable_step", False):
        return 1
    return max(d for d in range(1, min(cfg.compile_unroll, cfg.n_steps) + 1) if cfg.n_steps % d == 0)


def cpp_compiler() -> str | None:
    """The C++ compiler that torch.compile's CPU code would be built with (``CXX``, else g++, c++ or
    clang++ on the PATH), or None."""
    names = [os.environ["CXX"]] if os.environ.get("CXX") else []
    return next((path for name in [*names, "g++", "c++", "clang++"] if (path := shutil.which(name))), None)


def compile_choice(rt: Runtime, setting: bool | str, optimizer_steps: int) -> bool:
    """Whether this job compiles: ``compile=true/false`` as given; ``auto`` compiles a run of
    :data:`COMPILE_AUTO` optimizer steps or more on CPUs that can (torch and a C++ compiler: the
    same answer on every rank, agreed in one collective). GPUs stay eager under auto: compiled
    updates there are not measured yet. Says which and why when it is not obvious."""
    if isinstance(setting, bool):
        return setting
    if optimizer_steps < COMPILE_AUTO:  # a short run: the compile would cost more than it saves
        return False
    if rt.device.type != "cpu":
        why = f"on {rt.device.type} compiled updates are not measured yet (compile=true compiles them)"
    elif (unsupported := training_step_unsupported()) is not None:
        why = unsupported
    elif cpp_compiler() is None:
        why = "no C++ compiler (g++, c++, clang++) to build torch.compile's CPU code"
    else:
        why = None
    ranks_without = rt.all_reduce_sum({"cannot": float(why is not None)})["cannot"]
    if why is None and ranks_without:
        why = f"{int(ranks_without)} of {rt.world_size} ranks cannot compile"
    if why is not None:
        log.info("compile=auto: eager: %s", why)
        return False
    log.info(
        "compile=auto: compiled, for %d optimizer steps (10-50 s of compiling first; compile=false runs eagerly)",
        optimizer_steps,
    )
    return True


def precision_choice(rt: Runtime, setting: str, policy: str) -> str:
    """The precision this job trains in: as given, or for ``auto`` (the Atari preset's) bf16 autocast
    (fp32 weights) for a convolutional policy where every rank has bf16 units (``bf16_units``; agreed in
    one collective), whose update runs ~1.5x faster in bf16 and learns alike (docs/benchmarks.md: roofline,
    Pong's curves), else fp32: an MLP's small matrix products gain nothing from bf16. Says which for a
    convolutional policy, and where fp32 leaves bf16 units idle."""
    if setting not in ("auto", "fp32"):
        return setting
    if policy == "mlp":
        return "fp32"
    units = bf16_units(rt.device)
    if setting == "fp32":  # as given; the line says where bf16 would pay
        if units is not None:
            log.info(
                "this %s has %s: precision=auto or bf16 runs the update in bf16 with fp32 weights",
                rt.device.type,
                units,
            )
        return setting
    ranks_without = rt.all_reduce_sum({"without": float(units is None)})["without"]
    if units is None:
        why = f"no bf16 units on this {rt.device.type}"
    elif ranks_without:
        why = f"{int(ranks_without)} of {rt.world_size} ranks have no bf16 units"
    else:
        log.info("precision=auto: bf16 (this %s has %s), with fp32 weights", rt.device.type, units)
        return "bf16"
    log.info("precision=auto: fp32 (%s)", why)
    return "fp32"


def env_split(cfg: PPOConfig, placement: Placement, local_num_envs: int) -> dict[str, Any]:
    """``make_env``'s keywords for this rank's games: ``parts=2`` (the policy acts on one half while
    EnvPool's threads step the other, pinned to the rank's cores but its first) with
    ``env_overlap=true``, or ``auto`` where the env can and there is something to overlap with: a
    second core of the rank's own (:func:`rank_cores`) or a GPU acting; else none (one part)."""
    if cfg.env_overlap is False:
        return {}
    cores = rank_cores(placement, cfg.cpu_bind)
    why = atari.overlap_unsupported(cfg.task, cfg.env_backend, local_num_envs)
    if why is None and cfg.env_overlap == "auto" and placement.device.type == "cpu" and len(cores) < 2:
        why = "this rank has one core of its own: EnvPool's threads would take it from the policy"
    if why is not None:  # never with true: the config's check refused it
        if atari.atari_rom(cfg.task) is not None:
            log.info("env_overlap=auto: the games step together (%s)", why)
        return {}
    threads_on = beside_cores(cores)
    if threads_on is None:
        on = "any core"
    else:
        on = f"core {threads_on[0]}" if len(threads_on) == 1 else f"cores {threads_on[0]}-{threads_on[-1]}"
    log.info(
        "env_overlap: the policy acts on half of the %d games while the other half steps (EnvPool's threads on %s)",
        local_num_envs,
        on,
    )
    return {"parts": 2, "threads_on": threads_on}


def plan(cfg: PPOConfig, env: VecEnv, joint: bool = False) -> Plan:
    """The regions for ``cfg`` and ``env``; logs one line naming what stays out and why. ``joint``:
    the rollout acts through the joint MLP (``rollout.acts_jointly``), eagerly."""
    if not cfg.compile:
        return Plan(update=False, unroll=0)
    unsupported = training_step_unsupported()  # an old torch: the eager update on the compiled model
    update = cfg.precision != "fp16" and unsupported is None
    unroll, left_out = 0, []
    if getattr(env, "traceable_step", False):
        unroll = steps_per_call(cfg, env)
    elif joint:
        left_out.append("the rollout acts eagerly (actor and critic as one network: cheaper than compiled on a CPU)")
    else:
        left_out.append(f"the rollout compiles only the policy ({type(env).__name__} steps outside a graph)")
    if not update:
        why = unsupported or "precision=fp16: GradScaler skips steps on the host"
        left_out.insert(0, f"the update runs eagerly on the compiled model ({why})")
    compiled = ([f"rollout as graphs of {unroll} env steps"] if unroll else []) + (
        ["update as one graph per optimizer step"] if update else []
    )
    log.info("compile=true: %s", "; ".join([", ".join(compiled) or "torch.compile of the model", *left_out]))
    return Plan(update=update, unroll=unroll)


def advantages_and_returns(
    rt: Runtime, cfg: PPOConfig, rollout: Rollout, next_values: torch.Tensor, return_scaler: ReturnScaler
) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE on this rank's rollout, (T, N) each, with the reward scaling and the whole-rollout
    advantage normalisation (``norm_adv=true``) of ``cfg``; their statistics come from all ranks."""
    if cfg.norm_reward:
        # Statistics first (this rollout's returns from all ranks), then the scaling: GAE and
        # the value function work in units of the return's std, the same on every rank.
        return_scaler.update(rollout.rewards, rollout.terminated | rollout.truncated, reduce_sum=rt.all_reduce_sum)
        rollout = rollout._replace(rewards=return_scaler.scale(rollout.rewards))
    advantages, returns = compute_gae(rollout, next_values, cfg.gamma, cfg.gae_lambda)
    if cfg.norm_adv is True:
        # Normalised with the global mean/std (over all ranks' rollouts), so N ranks on N half
        # rollouts compute the same update as one process on the whole rollout. (minibatch:
        # in the update, per optimizer step.)
        advantages = standardize(advantages, rt.all_reduce_mean)
    return advantages, returns


def checkpoint_parts(
    policy: ActorCritic,
    optimizer: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler,
    obs_rms: RunningMeanStd,
    return_scaler: ReturnScaler,
) -> dict[str, Stateful]:
    """The checkpoint's shared state, by key: resumed (``Run.restore``) and saved (``state_of``)
    through this one table."""
    return {
        "model": policy,
        "optimizer": optimizer,
        "scaler": scaler,
        "obs_rms": obs_rms,
        "reward_stats": return_scaler.stats,
    }


def restore_own_state(run: Run, env: Any, return_scaler: ReturnScaler, obs: torch.Tensor) -> torch.Tensor:
    """Continue exactly where the interrupted run was (same RNG streams, same episodes) when this
    rank has a saved state: its envs and return carry restored. Otherwise the envs were built with
    seeds of the resume step. Returns the observations to go on from."""
    own = run.restore_rank_state()
    if own is not None:
        if own["env"] is not None:
            obs = env.load_state_dict(own["env"])
        return_scaler.carry.copy_(own["reward_carry"])
    return obs


def observation_normalizer(obs_rms: RunningMeanStd, enabled: bool) -> Callable[[torch.Tensor], torch.Tensor]:
    """What the policy sees of an observation: rescaled by ``obs_rms`` with ``norm_obs``, else as it is."""

    def normalize(x: torch.Tensor) -> torch.Tensor:
        return obs_rms.normalize(x) if enabled else x

    return normalize


def rollout_and_update(
    rt: Runtime,
    cfg: PPOConfig,
    env: VecEnv,
    policy: ActorCritic,
    optimizer: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler,
    normalize: Callable[[torch.Tensor], torch.Tensor],
    autocast: contextlib.AbstractContextManager,
    obs: torch.Tensor,
) -> tuple[RolloutBuffer, RolloutStep, UpdateStep]:
    """This rank's rollout storage, the rollout step that fills it and the update step that
    learns from it, run as :func:`plan` says (logged). Built after a resume's optimizer state is
    loaded: the update holds that state's tensors."""
    buffer = RolloutBuffer(
        cfg.n_steps,
        cfg.local_num_envs(rt.world_size),
        tuple(env.single_observation_space.shape),
        tuple(env.single_action_space.shape),
        torch.long if policy.discrete else torch.float32,
        rt.device,
        obs_storage_dtype(env.single_observation_space),
        obs_channels_last=policy.frames_channels_last(rt.device),
    )
    regions = plan(cfg, env, acts_jointly(env, policy, autocast))  # what compile=true compiles here (logged)
    rollout = RolloutStep(env, policy, buffer, normalize, autocast, steps_per_call(cfg, env), cfg.compile, obs)
    update = UpdateStep(
        rt,
        policy,
        optimizer,
        update_batch(buffer),
        cfg,
        normalize,
        autocast,
        compile=regions.update,
        scaler=scaler,
        model=torch.compile(policy) if cfg.compile and not regions.update else None,
    )
    return buffer, rollout, update


def train(rt: Runtime, cfg: PPOConfig) -> None:
    """Train PPO on ``cfg.task`` for ``cfg.steps`` global agent steps (runs on every rank)."""
    # -- sizes: global in, local derived (docs/distributed.md) ---------------------------------
    local_num_envs = cfg.local_num_envs(rt.world_size)
    local_rollout = cfg.n_steps * local_num_envs  # samples per rank and iteration
    cfg = cfg.with_minibatches(local_rollout)  # done already by the CLI; not by every caller
    steps_per_iteration = cfg.n_steps * local_num_envs * rt.world_size  # global
    num_iterations = math.ceil(cfg.steps / steps_per_iteration)

    run = Run(rt, cfg)  # the checkpoint being resumed (if any), seeds, later the run directory
    env = make_env(
        cfg.task,
        local_num_envs,
        seed=run.env_seed,
        device=rt.device,
        training=True,
        backend=cfg.env_backend,
        **cfg.env_kwargs,
        **env_split(cfg, rt.placement, local_num_envs),
    )
    obs = env.reset()
    policy = build_agent(cfg, env).to(rt.device)
    obs_rms = RunningMeanStd(tuple(env.single_observation_space.shape), mask=norm_obs_mask(env)).to(rt.device)
    return_scaler = ReturnScaler(local_num_envs, cfg.gamma).to(rt.device)
    optimizer = torch.optim.Adam(policy.parameters(), lr=cfg.lr, eps=1e-5)
    scaler = torch.amp.GradScaler(rt.device.type, enabled=cfg.precision == "fp16")
    parts = checkpoint_parts(policy, optimizer, scaler, obs_rms, return_scaler)
    run.restore(parts)
    start_iteration = run.counters["iteration"] if run.resumed else 0
    rt.broadcast_module(policy)  # rank 0's weights on every rank; the update averages gradients itself
    checksum = rt.check_in_sync(policy)
    log.info("parameters synchronised across %d rank(s) (checksum %.6f)", rt.world_size, checksum)
    obs = restore_own_state(run, env, return_scaler, obs)

    def save(step: int, iteration: int, score: float | None) -> None:
        rt.check_in_sync(policy, "parameters at checkpoint")
        own = {"env": env.state_dict(), "reward_carry": return_scaler.carry.cpu()}
        run.save(step, state_of(parts), counters={"iteration": iteration}, score=score, own=own)

    effective_batch = cfg.effective_batch_size(rt.world_size)
    run_dir = run.open(total_steps=num_iterations * steps_per_iteration)
    log.info(
        "run directory %s | %d ranks x %d envs | effective batch %d | %d iterations of %d steps",
        run_dir,
        rt.world_size,
        local_num_envs,
        effective_batch,
        num_iterations,
        steps_per_iteration,
    )
    optimizer_steps = num_iterations * cfg.epochs * (local_rollout // cfg.batch_size) // cfg.sync_freq
    cfg = dataclasses.replace(
        cfg,
        precision=precision_choice(rt, cfg.precision, cfg.policy),  # auto is never fp16: the scaler above holds
        compile=compile_choice(rt, cfg.compile, optimizer_steps),
    )
    normalize = observation_normalizer(obs_rms, cfg.norm_obs)
    autocast = autocast_context(rt.device, cfg.precision)
    buffer, rollout, update = rollout_and_update(rt, cfg, env, policy, optimizer, scaler, normalize, autocast, obs)

    global_step = run.step
    for iteration in range(start_iteration, num_iterations):
        if cfg.anneal_lr:
            for group in optimizer.param_groups:
                group["lr"] = cfg.lr * (1.0 - iteration / num_iterations)
        # -- rollout: n_steps in each local env (no gradient, no collective) ---------------------
        t_start = time.perf_counter()
        with run.split.phase("act"):  # the env's own steps are moved to "env" below
            env_s = rollout.env_s
            ep_return_sum, ep_count = rollout.collect()
            with torch.no_grad(), autocast:
                next_values = policy.value(normalize(rollout.observe())).float()
        run.split.move(rollout.env_s - env_s, "act", "env")  # a traceable env steps inside the act
        with run.split.phase("learn"):
            advantages, returns = advantages_and_returns(rt, cfg, buffer.data, next_values, return_scaler)
        t_rollout = time.perf_counter() - t_start
        # -- update -------------------------------------------------------------------------------
        t_update_start = time.perf_counter()
        with run.split.phase("learn"):
            update.load(advantages.flatten(), returns.flatten())  # the rest of the batch: the rollout storage
            metrics = learn(rt, update, cfg)
            if cfg.norm_obs:  # after the update: rollout and update used the same statistics
                obs_rms.update(buffer.data.obs, reduce_sum=rt.all_reduce_sum)
        t_update = time.perf_counter() - t_update_start
        # -- bookkeeping: every number is global (docs/distributed.md) ---------------------------
        global_step += steps_per_iteration
        lr = optimizer.param_groups[0]["lr"]
        metrics.update(
            iteration_metrics(rt, local_rollout, t_rollout, t_update, ep_return_sum, ep_count, effective_batch, lr)
        )
        last = iteration == num_iterations - 1
        if crossed(global_step, steps_per_iteration, cfg.eval_freq) or (last and cfg.eval_episodes > 0):
            metrics.update(run_eval(rt, cfg, run, env, policy, normalize, global_step))
        run.log(global_step, metrics)
        checkpoint_due = crossed(global_step, steps_per_iteration, cfg.checkpoint_freq)
        save_now = functools.partial(save, global_step, iteration + 1)
        run.step_boundary(global_step, save_now, metrics.get("eval/return_mean"), checkpoint_due, last)

    env.close()
    run.finish()  # rank 0 prints the summary block


def iteration_metrics(
    rt: Runtime,
    local_steps: int,
    t_rollout: float,
    t_update: float,
    ep_return_sum: torch.Tensor,
    ep_count: torch.Tensor,
    effective_batch: int,
    lr: float,
) -> dict[str, float]:
    """An iteration's times, throughput and training episodes over all ranks (one collective)."""
    local_fps = local_steps / (t_rollout + t_update)
    sums = rt.all_reduce_sum(
        {
            "fps": local_fps,
            "rollout_s": t_rollout,
            "update_s": t_update,
            "ep_return": ep_return_sum,
            "ep_count": ep_count,
        }
    )
    metrics = {
        "time/rollout_s": sums["rollout_s"] / rt.world_size,
        "time/update_s": sums["update_s"] / rt.world_size,
        "time/global_fps": sums["fps"],
    }
    metrics.update(system_metrics(rt))  # GPU utilisation and memory per rank (CUDA only)
    metrics["train/effective_batch_size"] = float(effective_batch)
    metrics["train/lr"] = lr
    if sums["ep_count"] > 0:
        metrics["train/episode_return"] = sums["ep_return"] / sums["ep_count"]
    return metrics


def run_eval(
    rt: Runtime,
    cfg: PPOConfig,
    run: Run,
    env: VecEnv,
    policy: ActorCritic,
    normalize: Callable[[torch.Tensor], torch.Tensor],
    step: int,
) -> dict[str, float]:
    """Evaluate ``policy`` on fresh envs (episodes split over ranks); global means."""
    # Sampled eval actions come from a generator of their own: the training RNG is untouched.
    generator = torch.Generator(device=rt.device).manual_seed(run.seeds.eval_actions(step))

    @torch.no_grad()
    def eval_act(x: torch.Tensor) -> torch.Tensor:
        return policy.eval_action(normalize(x), cfg.eval_deterministic, generator)

    def make_eval_env(n: int, seed: int) -> VecEnv:
        return make_env(cfg.task, n, seed=seed, device=rt.device, backend=cfg.env_backend, **cfg.env_kwargs)

    return run.evaluate(make_eval_env, eval_act, getattr(env, "extra_info_keys", ()))


def load_actor(cfg: PPOConfig, state: dict[str, Any], device: torch.device) -> Actor:
    """The PPO policy of a checkpoint's ``state``, for eval and play (``cfg.eval_deterministic``)."""

    def make(num_envs: int, seed: int):
        return make_env(cfg.task, num_envs, seed=seed, device=device, backend=cfg.env_backend, **cfg.env_kwargs)

    probe = make(1, cfg.seed)
    agent = build_agent(cfg, probe).to(device).eval()
    extra_keys = tuple(getattr(probe, "extra_info_keys", ()))
    obs_shape = tuple(probe.single_observation_space.shape)
    probe.close()
    agent.load_state_dict(state["model"])
    obs_rms = RunningMeanStd(obs_shape).to(device)  # the saved statistics leave masked columns alone
    obs_rms.load_state_dict(state["obs_rms"])

    generator = torch.Generator(device=device).manual_seed(Seeds(cfg.seed, rank=0).eval_actions())

    @torch.no_grad()
    def act(obs: torch.Tensor) -> torch.Tensor:
        return agent.eval_action(obs_rms.normalize(obs) if cfg.norm_obs else obs, cfg.eval_deterministic, generator)

    return Actor(make, act, extra_keys)
