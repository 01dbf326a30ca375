"""TD-MPC2 data-parallel: every rank acts in its own env and fills its own replay buffer; one world
model and one policy prior learn from all ranks' batches.

The algorithm is :func:`train`, read top to bottom; ``learner.update`` is one optimizer step
of world model and policy (docs/tdmpc2.md, "Schedule, and what N ranks change"), one compiled
region with ``compile=true``. Neither touches the process group: the collectives go through the
runtime ``rt``. ``schedule.Schedule`` decides when to act randomly, how many updates to make,
and when to log, evaluate and save, from global step counts alone: every rank decides alike.

- ``steps`` and ``seed_steps`` count *global* agent steps (summed over ranks; one agent step
  is two DMC simulator steps).
- ``sync_freq = k``: one optimizer step per k micro-batches; their gradients are summed
  locally and all-reduced once. Effective batch = batch_size x world_size x k.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ddprl.algos.tdmpc2.acting import Acting, EpisodeRecorder, NotifyEpisodeEnds
from ddprl.algos.tdmpc2.buffer import EpisodeBuffer, TrajectoryBatch
from ddprl.algos.tdmpc2.env import episode_length_of, make_tdmpc2_env
from ddprl.algos.tdmpc2.learner import Learner, UpdateNoise, build_learner, draw_noise, model_dims, update
from ddprl.algos.tdmpc2.math import discount_for_episode_length
from ddprl.algos.tdmpc2.networks import WorldModel
from ddprl.algos.tdmpc2.schedule import Schedule
from ddprl.checkpoint import buffer_path, restore_buffer
from ddprl.errors import UsageError
from ddprl.evaluate import Actor
from ddprl.run import Run

if TYPE_CHECKING:
    from ddprl.algos.tdmpc2.config import TDMPC2Config
    from ddprl.runtime.collectives import Runtime

log = logging.getLogger("ddprl")

# ---------------------------------------------------------------------------------------------
# pieces of the loop


def check_state_in_sync(rt: Runtime, learner: Learner) -> None:
    """Raise if target Qs or the Q scale differ across ranks (buffers: check_in_sync sees parameters)."""
    values = [t.detach().double().sum() for t in learner.model.target_qs.tensors()] + [
        learner.scale.value.double().sum()
    ]
    checksum = float(sum(float(v) * (i + 1) for i, v in enumerate(values)))
    sums = rt.all_gather_object(checksum)
    if max(sums) - min(sums) > 1e-6 * (1.0 + abs(checksum)):
        raise RuntimeError(f"target Qs / Q scale differ across ranks: checksums {sums}")


def shared_generator(rt: Runtime, run: Run) -> torch.Generator:
    """Shared randomness: the Q-member pairs of each update, identical on every rank. Resumed:
    where the interrupted run left it (a checkpoint from another device type: seeded from the
    resume step, as any common seed keeps the ranks agreeing)."""
    shared = torch.Generator(device=rt.device).manual_seed(run.seeds.shared())
    if run.resumed:
        if run.state["shared_rng"].numel() == shared.get_state().numel():
            shared.set_state(run.state["shared_rng"])
        else:
            shared.manual_seed(run.seeds.shared(run.step))
    return shared


def start_learning_when_ready(
    rt: Runtime, cfg: TDMPC2Config, run: Run, schedule: Schedule, buffer: EpisodeBuffer
) -> None:
    """Collective: learning starts once every rank holds a whole episode (>= horizon steps) to
    sample from. A collective on a global condition: asked once in DMC (fixed-length episodes),
    more only while some rank's first episode is still running."""
    not_ready = rt.all_reduce_sum(0 if buffer.num_starts(cfg.horizon) > 0 else 1)
    if not_ready == 0:
        schedule.start_learning()  # the pretraining burst, unless made before a resume
        run.step_cost_changes()  # from ~1 ms a random step to an update and a plan a step


def draw_batches(
    cfg: TDMPC2Config, buffer: EpisodeBuffer, shared: torch.Generator, num_q: int, device: torch.device
) -> tuple[list[TrajectoryBatch], list[UpdateNoise]]:
    """The ``sync_freq`` micro-batches of one update, sampled on the CPU and copied without
    blocking (no wait for the previous update's kernels), and their noise from the shared generator."""
    batches = [buffer.sample(cfg.batch_size, cfg.horizon).to(device, non_blocking=True) for _ in range(cfg.sync_freq)]
    noises = [draw_noise(shared, num_q, device) for _ in range(cfg.sync_freq)]
    return batches, noises


def run_eval(rt: Runtime, cfg: TDMPC2Config, run: Run, model: WorldModel, discount: float) -> dict[str, float]:
    """Collective: episodes on fresh envs (split over ranks), acting as ``eval_deterministic`` says; global means."""
    eval_acting = Acting(model, cfg, discount)  # its own warm-start state, eval batch size

    def make_eval_env(n: int, seed: int) -> NotifyEpisodeEnds:
        return NotifyEpisodeEnds(make_tdmpc2_env(cfg, n, seed, rt.device), eval_acting)

    return run.evaluate(make_eval_env, lambda o: eval_acting(o, eval_mode=cfg.eval_deterministic))


def build_replay(
    rt: Runtime, cfg: TDMPC2Config, run: Run, obs_dim: int, action_dim: int
) -> tuple[EpisodeBuffer, int | None]:
    """This rank's replay buffer, and the transitions it got back (None: every rank refills).
    Collective when resumed: the buffers come back only when every rank finds its own, saved at
    this very step (on another number of ranks, its share of all of them)."""
    buffer = EpisodeBuffer(cfg.buffer_size, obs_dim, action_dim)
    if not run.resumed:
        return buffer, None
    found = restore_buffer(buffer, Path(cfg.resume).parent, run.checkpoint, rt.rank, rt.world_size)
    if rt.all_reduce_sum(int(found)) == rt.world_size:
        return buffer, len(buffer)
    return EpisodeBuffer(cfg.buffer_size, obs_dim, action_dim), None


def schedule_for_run(rt: Runtime, cfg: TDMPC2Config, run: Run, episode_length: int, restored: int | None) -> Schedule:
    """The run's schedule (fresh, or from the resumed checkpoint's counters); a resume says where
    it goes on from."""
    counters = run.counters if run.resumed else None
    schedule = Schedule.for_run(cfg, rt.world_size, episode_length, run.step, counters, restored)
    if restored is not None:
        log.info(
            "resumed at step %d after %d updates with the replay buffers (%d transitions on rank 0)",
            schedule.step,
            schedule.updates,
            restored,
        )
    elif run.resumed:
        log.info(
            "resumed at step %d after %d updates; refilling the replay buffers until step %d",
            schedule.step,
            schedule.updates,
            schedule.learn_from,
        )
    return schedule


class Window:
    """What happened on this rank since the last metrics row; :meth:`metrics` reduces it over ranks."""

    def __init__(self, step: int):
        self.start, self.start_step = time.perf_counter(), step
        self.terms: torch.Tensor | None = None  # the updates' metrics summed (one device tensor)
        self.updates = 0
        self.episodes = torch.zeros(2)  # (sum of returns, episodes), on the CPU like the env's

    def add_terms(self, terms: torch.Tensor) -> None:
        self.terms = terms if self.terms is None else self.terms + terms  # one add, not one per metric
        self.updates += 1

    def add_episodes(self, returns: torch.Tensor, done: torch.Tensor) -> None:
        self.episodes += torch.stack([(returns * done).sum(), done.sum()]).float()

    def metrics(
        self, rt: Runtime, names: Sequence[str], step: int, updates: int, effective_batch: int, transitions: int
    ) -> dict[str, float]:
        """Collective: the window's global metrics at global ``step`` (four reductions)."""
        elapsed = time.perf_counter() - self.start
        local_fps = (step - self.start_step) / rt.world_size / max(elapsed, 1e-9)
        # updates is the same on every rank (they follow the global counter): no rank skips this
        mean_terms = dict(zip(names, (self.terms / self.updates).tolist(), strict=True)) if self.updates else {}
        metrics = rt.all_reduce_mean(mean_terms)
        episodes = rt.all_reduce_sum(self.episodes)
        metrics["time/global_fps"] = rt.all_reduce_sum(local_fps)
        metrics["train/updates"] = float(updates)
        metrics["train/effective_batch_size"] = float(effective_batch)
        metrics["train/buffer_transitions"] = float(rt.all_reduce_sum(transitions))
        if episodes[1] > 0:
            metrics["train/episode_return"] = float(episodes[0] / episodes[1])
        return metrics


# ---------------------------------------------------------------------------------------------
# the loop


def train(rt: Runtime, cfg: TDMPC2Config) -> None:
    """Train TD-MPC2 on ``cfg.task`` for ``cfg.steps`` global agent steps (runs on every rank)."""
    # -- sizes: global in, local derived (docs/distributed.md, invariant 4) ----------------------
    local_num_envs = cfg.local_num_envs(rt.world_size)
    run = Run(rt, cfg)  # the checkpoint being resumed (if any), seeds, later the run directory
    # The env first: a task TD-MPC2 cannot learn fails here, before a run directory exists.
    # The env steps on the CPU (MuJoCo) and its tensors stay there: only observations go to the
    # device, to act. Recording episodes then never waits for the device's queued work.
    env = make_tdmpc2_env(cfg, local_num_envs, seed=run.env_seed, device=torch.device("cpu"))
    obs_dim, action_dim = env.single_observation_space.shape[0], env.single_action_space.shape[0]
    episode_length = episode_length_of(cfg, env)
    discount = cfg.discount if cfg.discount is not None else discount_for_episode_length(episode_length)
    if cfg.buffer_size <= episode_length:
        raise UsageError(f"buffer_size={cfg.buffer_size} must exceed the episode length {episode_length}")

    learner = build_learner(rt, cfg, obs_dim, action_dim, run.state if run.resumed else None)
    model = learner.model
    shared = shared_generator(rt, run)
    # This rank's RNG where the interrupted run left it. Episodes start afresh (the replay
    # buffer holds whole episodes only), in envs seeded from the resume step: none of the
    # interrupted run's episodes is replayed.
    run.restore_rank_state()
    checksum = rt.check_in_sync(model)
    log.info("parameters synchronised across %d rank(s) (checksum %.6f)", rt.world_size, checksum)
    buffer, restored = build_replay(rt, cfg, run, obs_dim, action_dim)
    schedule = schedule_for_run(rt, cfg, run, episode_length, restored)
    recorder = EpisodeRecorder(local_num_envs)
    acting = Acting(model, cfg, discount, compile=cfg.compile)
    effective_batch = cfg.effective_batch_size(rt.world_size)
    run_dir = run.open(total_steps=cfg.steps)
    log.info(
        "run directory %s | %d ranks x %d envs | effective batch %d | discount %.4g | seed steps %d | "
        "episode length %d",
        run_dir,
        rt.world_size,
        local_num_envs,
        effective_batch,
        discount,
        schedule.seed_steps,
        episode_length,
    )

    def save(step: int, score: float | None) -> None:
        rt.check_in_sync(model, "parameters at checkpoint")
        check_state_in_sync(rt, learner)
        if cfg.checkpoint_buffer:  # each rank its own file, written before rank 0 writes latest.pt
            own_file = buffer_path(run_dir / "checkpoints", rt.rank)
            run.save_own_file({"step": step, "buffer": buffer.state_dict()}, own_file)
        state = {**learner.state_dict(), "shared_rng": shared.get_state()}
        run.save(step, state, counters=schedule.counters(), score=score)

    obs = env.reset()
    recorder.start(obs)
    window = Window(schedule.step)
    while not schedule.done:
        # -- act: random while seeding, else plan (MPPI) or the policy prior ---------------------
        with run.split.phase("act"):
            if schedule.acts_randomly:
                action = torch.rand(local_num_envs, action_dim) * 2 - 1
            else:
                action = acting(obs.to(rt.device, non_blocking=True)).cpu()  # waits for the act only
        schedule.advance()

        # -- learn: decided on global counters only, so every rank does the same ---------------
        # Before the env step: on a GPU the update's kernels run while the CPU steps the env
        # (the next act waits for them). Nothing is lost: this step's transition enters the
        # buffer with its whole episode, later.
        if schedule.may_start_learning:
            start_learning_when_ready(rt, cfg, run, schedule, buffer)  # collective
        with run.split.phase("learn"):
            for _ in range(schedule.take_updates()):
                batches, noises = draw_batches(cfg, buffer, shared, model.num_q, rt.device)
                window.add_terms(update(rt, learner, batches, noises, cfg, discount))

        # -- env step, recorded: episodes enter the buffer when they end ---------------------
        with run.split.phase("env"):
            next_obs, reward, terminated, truncated, info = env.step(action)
            done = terminated | truncated
            acting.episode_ended(done)
            for episode in recorder.add(action, reward, terminated, done, info["final_obs"], next_obs):
                buffer.add_episode(*episode)
            window.add_episodes(info["episode_return"], done)
        obs = next_obs

        # -- bookkeeping: every number is global (docs/distributed.md, invariant 7) -------------
        global_step, evaluating, score = schedule.step, schedule.eval_due, None
        if schedule.log_due or evaluating:
            metrics = window.metrics(rt, learner.names, global_step, schedule.updates, effective_batch, len(buffer))
            if evaluating:
                metrics.update(run_eval(rt, cfg, run, model, discount))
                score = metrics.get("eval/return_mean")
            run.log(global_step, metrics)
            window = Window(global_step)
        save_now = functools.partial(save, global_step)
        run.step_boundary(global_step, save_now, score, due=schedule.checkpoint_due, last=schedule.done)

    env.close()
    run.finish()  # rank 0 prints the summary block


# ---------------------------------------------------------------------------------------------
# evaluation and play


def load_actor(cfg: TDMPC2Config, state: dict[str, Any], device: torch.device) -> Actor:
    """A TD-MPC2 agent from a checkpoint's ``state`` (written by any number of ranks), for eval
    and video: MPPI in eval mode (no exploration noise), or the policy mean when ``mpc=false``;
    ``eval_deterministic=false`` acts as training does (the noise added, the prior sampled)."""
    probe = make_tdmpc2_env(cfg, 1, cfg.seed, device)
    obs_dim, action_dim = probe.single_observation_space.shape[0], probe.single_action_space.shape[0]
    discount = cfg.discount if cfg.discount is not None else discount_for_episode_length(episode_length_of(cfg, probe))
    probe.close()
    model = WorldModel(obs_dim, action_dim, dims=model_dims(cfg), dropout=cfg.dropout)
    model.load_state_dict(state["model"])
    model.to(device).eval()
    acting = Acting(model, cfg, discount)

    def make(num_envs: int, seed: int):
        return NotifyEpisodeEnds(make_tdmpc2_env(cfg, num_envs, seed, device), acting)

    return Actor(make, lambda obs: acting(obs, eval_mode=cfg.eval_deterministic), ())
