"""PPO with DDP: every rank collects its own rollout, one model learns from all of them.

The whole algorithm is :func:`train`, read top to bottom; :func:`learn` is its update phase
(epochs x minibatches, ``sync_freq`` accumulation, global-KL early stop), and
:func:`learn_compiled` the same phase with each optimizer step one compiled graph
(``compile=true``, ``ddprl.algos.ppo.regions``). None touches the process group: collectives
go through the runtime ``rt``.
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any

import torch

from ddprl.algos.common import autocast_context, crossed
from ddprl.algos.ppo.loss import ppo_loss
from ddprl.algos.ppo.networks import ActorCritic
from ddprl.algos.ppo.regions import TERMS, CompiledRollout, CompiledUpdate, plan, update_batch
from ddprl.algos.ppo.rollout import RolloutBuffer, compute_gae
from ddprl.checkpoint import strip_prefixes
from ddprl.envs import make_env
from ddprl.evaluate import Actor, evaluate
from ddprl.normalize import ReturnScaler, RunningMeanStd
from ddprl.run import Run
from ddprl.runtime.seeding import Seeds
from ddprl.system import system_metrics

log = logging.getLogger("ddprl")


def build_agent(cfg: Any, env: Any) -> ActorCritic:
    return ActorCritic(env.single_observation_space, env.single_action_space, policy=cfg.policy,
                       hidden_sizes=list(cfg.hidden_sizes), policy_width=cfg.policy_width,
                       policy_depth=cfg.policy_depth)


def learn(rt: Any, model: torch.nn.Module, optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler,
          batch: dict[str, torch.Tensor], cfg: Any) -> dict[str, float]:
    """PPO's update phase on this rank's flattened rollout ``batch``; returns global means.

    Each optimizer step sees ``sync_freq`` minibatches of ``batch_size`` per rank: the first
    k-1 backward passes run under ``no_sync`` (local accumulation), the k-th all-reduces
    (DESIGN.md invariant 5). Every rank has the same number of samples, so the same number of
    minibatches, so the same collectives; the KL early stop uses the globally reduced KL.
    """
    n = batch["obs"].shape[0]
    num_minibatches = n // cfg.batch_size
    k = cfg.sync_freq
    autocast = autocast_context(rt.device, cfg.precision)
    sums: dict[str, torch.Tensor] = {}
    count = 0
    epochs_done = 0
    for _ in range(cfg.epochs):
        perm = torch.randperm(n, device=batch["obs"].device)
        epoch_kl = torch.zeros((), device=rt.device)
        for i in range(num_minibatches):
            idx = perm[i * cfg.batch_size:(i + 1) * cfg.batch_size]
            group_start = (i // k) * k
            group_size = min(k, num_minibatches - group_start)  # the last group may be shorter
            steps_optimizer = i - group_start == group_size - 1
            with rt.no_sync(model, enabled=not steps_optimizer):
                with autocast:
                    out = model(batch["obs"][idx], batch["actions"][idx])
                terms = ppo_loss(out, batch["log_probs"][idx], batch["values"][idx], batch["advantages"][idx],
                                 batch["returns"][idx], cfg.clip_coef, cfg.clip_vloss, cfg.vf_coef, cfg.ent_coef)
                scaler.scale(terms["loss"] / group_size).backward()
            if steps_optimizer:
                scaler.unscale_(optimizer)
                if cfg.max_grad_norm > 0:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
                scaler.step(optimizer)
                scaler.update()
                optimizer.zero_grad(set_to_none=True)
            for key, value in terms.items():
                sums[key] = sums.get(key, 0.0) + value.detach().float()
            epoch_kl += terms["approx_kl"]
            count += 1
        epochs_done += 1
        if cfg.target_kl is not None:
            # Decided on the KL averaged over ranks: a per-rank decision would let one rank
            # leave the epoch loop while the others wait in its all-reduce (a deadlock).
            global_kl = rt.all_reduce_mean(float(epoch_kl) / max(1, num_minibatches))
            if global_kl > cfg.target_kl:
                break
    local = {f"train/{k}": float(v) / max(1, count) for k, v in sums.items()}
    local["train/epochs"] = float(epochs_done)
    return rt.all_reduce_mean(local)


def learn_compiled(rt: Any, update: CompiledUpdate, cfg: Any) -> dict[str, float]:
    """:func:`learn` with each optimizer step one replay of ``update``'s graph; returns global means.

    The same minibatches (one ``randperm`` per epoch, cut in ``batch_size`` slices, grouped by
    ``sync_freq``: a shorter last group compiles a second graph) and the same global-KL early
    stop; the only host reads are the KL once per epoch and the metrics at the end.
    """
    n = update.batch["advantages"].shape[0]
    num_minibatches = n // cfg.batch_size
    k = cfg.sync_freq
    device = update.batch["advantages"].device
    update.sync_lr()
    sums = torch.zeros(len(TERMS), device=device)
    epochs_done = 0
    for _ in range(cfg.epochs):
        perm = torch.randperm(n, device=device)
        minibatches = perm[:num_minibatches * cfg.batch_size].view(num_minibatches, cfg.batch_size)
        epoch_sums = torch.zeros(len(TERMS), device=device)
        for group_start in range(0, num_minibatches, k):
            epoch_sums += update.step(minibatches[group_start:group_start + k]).sum(0)
        sums += epoch_sums
        epochs_done += 1
        if cfg.target_kl is not None:
            # Decided on the KL averaged over ranks (see learn): no rank leaves the loop alone.
            global_kl = rt.all_reduce_mean(float(epoch_sums[TERMS.index("approx_kl")]) / max(1, num_minibatches))
            if global_kl > cfg.target_kl:
                break
    count = max(1, epochs_done * num_minibatches)
    local = {f"train/{name}": value / count for name, value in zip(TERMS, sums.tolist())}
    local["train/epochs"] = float(epochs_done)
    return rt.all_reduce_mean(local)


def train(rt: Any, cfg: Any) -> None:
    """Train PPO on ``cfg.task`` for ``cfg.steps`` global agent steps (runs on every rank)."""
    # -- sizes: global in, local derived (DESIGN.md invariant 4) -------------------------------
    local_num_envs = cfg.local_num_envs(rt.world_size)
    steps_per_iteration = cfg.n_steps * local_num_envs * rt.world_size  # global
    num_iterations = math.ceil(cfg.steps / steps_per_iteration)

    run = Run(rt, cfg)  # the checkpoint being resumed (if any), seeds, later the run directory
    env = make_env(cfg.task, local_num_envs, seed=run.env_seed, device=rt.device, **cfg.env_kwargs)
    obs = env.reset()

    agent = build_agent(cfg, env)
    obs_rms = RunningMeanStd(tuple(env.single_observation_space.shape)).to(rt.device)
    return_scaler = ReturnScaler(local_num_envs, cfg.gamma).to(rt.device)
    global_step, start_iteration = run.step, 0
    if run.resumed:
        agent.load_state_dict(run.state["model"])
        obs_rms.load_state_dict(run.state["obs_rms"])
        return_scaler.stats.load_state_dict(run.state["reward_stats"])
        start_iteration = run.counters["iteration"]
    regions = plan(cfg, env)  # what compile=true runs as compiled graphs here (logged)
    if regions.update:
        # The update region averages gradients itself (rt.region_mean): no DDP wrapper,
        # so rank 0's weights are broadcast here, as DDP would at construction.
        model = agent.to(rt.device)
        rt.broadcast_module(model)
    else:
        model = rt.wrap(agent, compile=cfg.compile)
    policy = rt.unwrap(model)  # acting needs no gradient sync: skip the DDP forward
    act = torch.compile(policy.act) if cfg.compile and not regions.unroll else policy.act
    checksum = rt.check_in_sync(model)
    log.info("parameters synchronised across %d rank(s) (checksum %.6f)", rt.world_size, checksum)
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.lr, eps=1e-5, fused=True)  # one kernel for all params
    scaler = torch.amp.GradScaler(rt.device.type, enabled=cfg.precision == "fp16")
    if run.resumed:
        optimizer.load_state_dict(run.state["optimizer"])
        scaler.load_state_dict(run.state["scaler"])
    # Continue exactly where the interrupted run was (same RNG streams, same episodes) when this
    # rank has a saved state; otherwise the envs were built with seeds of the resume step.
    own = run.restore_rank_state()
    if own is not None:
        if own["env"] is not None:
            obs = env.load_state_dict(own["env"])
        return_scaler.carry.copy_(own["reward_carry"])

    def normalize(x: torch.Tensor) -> torch.Tensor:
        return obs_rms.normalize(x) if cfg.norm_obs else x

    def save(step: int, iteration: int, score: float | None) -> None:
        rt.check_in_sync(model, "parameters at checkpoint")
        state = {"model": strip_prefixes(policy.state_dict()), "optimizer": optimizer.state_dict(),
                 "scaler": scaler.state_dict(), "obs_rms": obs_rms.state_dict(),
                 "reward_stats": return_scaler.stats.state_dict()}
        run.save(step, state, counters={"iteration": iteration}, score=score,
                 own={"env": env.state_dict(), "reward_carry": return_scaler.carry.cpu()})

    def run_eval(step: int) -> dict[str, float]:
        # Sampled eval actions come from a generator of their own: the training RNG is untouched.
        generator = torch.Generator(device=rt.device).manual_seed(run.seeds.eval_actions(step))

        @torch.no_grad()
        def eval_act(x: torch.Tensor) -> torch.Tensor:
            return policy.eval_action(normalize(x), cfg.eval_deterministic, generator)

        result = evaluate(rt, lambda n, s: make_env(cfg.task, n, seed=s, device=rt.device, **cfg.env_kwargs),
                          eval_act, cfg.eval_episodes, cfg.seed, extra_keys=getattr(env, "extra_info_keys", ()),
                          progress=run.eval_progress)
        return {f"eval/{k}": v for k, v in result.items()}

    effective_batch = cfg.effective_batch_size(rt.world_size)
    run_dir = run.open(total_steps=num_iterations * steps_per_iteration)
    log.info("run directory %s | %d ranks x %d envs | effective batch %d | %d iterations of %d steps",
             run_dir, rt.world_size, local_num_envs, effective_batch, num_iterations, steps_per_iteration)
    action_shape = tuple(env.single_action_space.shape)
    buffer = RolloutBuffer(cfg.n_steps, local_num_envs, tuple(env.single_observation_space.shape), action_shape,
                           torch.long if agent.discrete else torch.float32, rt.device)
    autocast = autocast_context(rt.device, cfg.precision)
    zeros = torch.zeros(local_num_envs, device=rt.device)
    # After a resume's optimizer state is loaded: the update region holds that state's tensors.
    rollout_region = (CompiledRollout(env, policy, buffer, normalize, autocast, regions.unroll)
                      if regions.unroll else None)
    update_region = CompiledUpdate(rt, policy, optimizer, update_batch(buffer), cfg, normalize,
                                   autocast) if regions.update else None

    for iteration in range(start_iteration, num_iterations):
        if cfg.anneal_lr:
            for group in optimizer.param_groups:
                group["lr"] = cfg.lr * (1.0 - iteration / num_iterations)
        # -- rollout: n_steps in each local env (no gradient, no collective) ---------------------
        t_start = time.perf_counter()
        ep_return_sum = torch.zeros((), device=rt.device)
        ep_count = torch.zeros((), device=rt.device)
        with torch.no_grad():
            if rollout_region is not None:  # the same steps, `unroll` of them per graph replay
                ep_return_sum, ep_count = rollout_region.collect()
                obs = env.observe()
            else:
                for t in range(cfg.n_steps):
                    with autocast:
                        action, log_prob, value = act(normalize(obs))
                    next_obs, reward, terminated, truncated, info = env.step(action)
                    # V(final_obs) bootstraps truncated episodes (kept apart from terminated ones). On
                    # the CPU, skip the forward when nothing was truncated; on a GPU asking would cost
                    # a host sync, so always compute it.
                    if rt.device.type != "cpu" or bool(truncated.any()):
                        with autocast:
                            final_values = policy.value(normalize(info["final_obs"])).float()
                    else:
                        final_values = zeros
                    buffer.store(t, obs=obs, actions=action, log_probs=log_prob, values=value,
                                 rewards=reward, terminated=terminated, truncated=truncated, final_values=final_values)
                    done = terminated | truncated
                    ep_return_sum += (info["episode_return"] * done).sum()
                    ep_count += done.sum()
                    obs = next_obs
            with autocast:
                next_values = policy.value(normalize(obs)).float()
        rollout = buffer.data
        if cfg.norm_reward:
            # Statistics first (this rollout's returns from all ranks), then the scaling: GAE and
            # the value function work in units of the return's std, the same on every rank.
            return_scaler.update(rollout.rewards, rollout.terminated | rollout.truncated, reduce_sum=rt.all_reduce_sum)
            rollout = rollout._replace(rewards=return_scaler.scale(rollout.rewards))
        advantages, returns = compute_gae(rollout, next_values, cfg.gamma, cfg.gae_lambda)
        if cfg.norm_adv:
            # Normalised with the global mean/std (over all ranks' rollouts), so DDP on N half
            # rollouts computes the same update as one process on the whole rollout.
            moments = rt.all_reduce_sum(torch.stack([advantages.new_tensor(advantages.numel()),
                                                     advantages.sum(), (advantages ** 2).sum()]))
            mean = moments[1] / moments[0]
            std = (moments[2] / moments[0] - mean ** 2).clamp_min(0).sqrt()
            advantages = (advantages - mean) / (std + 1e-8)
        t_rollout = time.perf_counter() - t_start

        # -- update -------------------------------------------------------------------------------
        t_update_start = time.perf_counter()
        if update_region is not None:  # reads the rollout storage in place, normalises inside
            update_region.load(advantages.flatten(), returns.flatten())
            metrics = learn_compiled(rt, update_region, cfg)
        else:
            batch = {
                "obs": normalize(rollout.obs.flatten(0, 1)), "actions": rollout.actions.flatten(0, 1),
                "log_probs": rollout.log_probs.flatten(), "values": rollout.values.flatten(),
                "advantages": advantages.flatten(), "returns": returns.flatten(),
            }
            metrics = learn(rt, model, optimizer, scaler, batch, cfg)
        if cfg.norm_obs:  # after the update: rollout and update used the same statistics
            obs_rms.update(rollout.obs, reduce_sum=rt.all_reduce_sum)
        t_update = time.perf_counter() - t_update_start

        # -- bookkeeping: every number is global (DESIGN.md invariant 7) -------------------------
        global_step += steps_per_iteration
        local_fps = cfg.n_steps * local_num_envs / (t_rollout + t_update)
        # One collective for all bookkeeping sums; times are then averaged over ranks.
        sums = rt.all_reduce_sum({"fps": local_fps, "rollout_s": t_rollout, "update_s": t_update,
                                  "ep_return": ep_return_sum, "ep_count": ep_count})
        metrics["time/rollout_s"] = sums["rollout_s"] / rt.world_size
        metrics["time/update_s"] = sums["update_s"] / rt.world_size
        metrics["time/global_fps"] = sums["fps"]
        metrics.update(system_metrics(rt))  # GPU utilisation and memory per rank (CUDA only)
        metrics["train/effective_batch_size"] = float(effective_batch)
        metrics["train/lr"] = optimizer.param_groups[0]["lr"]
        if sums["ep_count"] > 0:
            metrics["train/episode_return"] = sums["ep_return"] / sums["ep_count"]
        last = iteration == num_iterations - 1
        if crossed(global_step, steps_per_iteration, cfg.eval_freq) or (last and cfg.eval_episodes > 0):
            metrics.update(run_eval(global_step))
        run.log(global_step, metrics)
        preempted = not last and run.stop_requested()  # collective: a SIGTERM/SIGUSR1 reached some rank
        score = metrics.get("eval/return_mean")
        if crossed(global_step, steps_per_iteration, cfg.checkpoint_freq) or last or preempted or run.improves(score):
            save(global_step, iteration + 1, score=score)
        if preempted:
            run.preempted(global_step)  # every rank leaves here together; exit code 75

    env.close()
    run.finish()  # rank 0 prints the summary block



def load_actor(cfg: Any, state: dict[str, Any], device: torch.device) -> Actor:
    """The PPO policy of a checkpoint's ``state``, for eval and play (``cfg.eval_deterministic``)."""
    def make(num_envs: int, seed: int):
        return make_env(cfg.task, num_envs, seed=seed, device=device, **cfg.env_kwargs)

    probe = make(1, cfg.seed)
    agent = build_agent(cfg, probe).to(device).eval()
    extra_keys = tuple(getattr(probe, "extra_info_keys", ()))
    obs_shape = tuple(probe.single_observation_space.shape)
    probe.close()
    agent.load_state_dict(state["model"])
    obs_rms = RunningMeanStd(obs_shape).to(device)
    obs_rms.load_state_dict(state["obs_rms"])

    generator = torch.Generator(device=device).manual_seed(Seeds(cfg.seed, rank=0).eval_actions())

    @torch.no_grad()
    def act(obs: torch.Tensor) -> torch.Tensor:
        return agent.eval_action(obs_rms.normalize(obs) if cfg.norm_obs else obs, cfg.eval_deterministic, generator)

    return Actor(make, act, extra_keys)
