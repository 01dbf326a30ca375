"""QMIX with DDP: every rank plays its own envs and keeps its own episode replay; one set of
networks learns from all ranks' batches. :func:`train` is the whole loop, top to bottom.

Stages share the loop: ``stage=qmix`` learns Q-values (epsilon-greedy acting), and
``stage=pretrain`` trains an observation autoencoder on episodes of random actions. Each stage
wraps in DDP only the modules it trains; ``init_from`` carries networks from one stage's
checkpoint into the next.
"""

from __future__ import annotations

import functools
import logging
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ddprl.algos.common import crossed
from ddprl.algos.qmix.buffer import EpisodeBuffer, EpisodeStaging, episode_fields
from ddprl.algos.qmix.config import is_graph_stage
from ddprl.algos.qmix.graph_stages import build_reconstructer, reconstructer_state
from ddprl.algos.qmix.learner import AutoencoderLearner, QLearner, epsilon_at, select_actions
from ddprl.algos.qmix.networks import Autoencoder, QNetwork
from ddprl.algos.qmix.stage import build_networks, init_from_checkpoint, load_networks, q_network
from ddprl.checkpoint import buffer_path, load_checkpoint, restore_buffer, strip_prefixes
from ddprl.envs.marl import make_marl_env
from ddprl.envs.marl.base import MAObs, MultiAgentVecEnv
from ddprl.envs.marl.graph import NodeLayout
from ddprl.errors import UsageError
from ddprl.evaluate import Actor
from ddprl.run import Run
from ddprl.system import system_metrics

if TYPE_CHECKING:
    from ddprl.algos.qmix.config import QMIXConfig
    from ddprl.runtime.collectives import Runtime

log = logging.getLogger("ddprl")


class Acting:
    """Actions for a batch of envs, carrying each agent's GRU state and last action between steps."""

    def __init__(self, net: QNetwork):
        self.net = net
        self.hidden: torch.Tensor | None = None
        self.last: torch.Tensor | None = None

    @torch.no_grad()
    def __call__(self, obs: MAObs, epsilon: float = 0.0, generator: torch.Generator | None = None) -> torch.Tensor:
        n, a = obs.obs.shape[:2]
        if self.last is None or self.last.shape[0] != n:
            self.last = torch.full((n, a), -1, dtype=torch.long, device=obs.obs.device)
            self.hidden = None
        new = obs.first.unsqueeze(-1)  # episodes that start now: no memory, no last action
        self.last = self.last.masked_fill(new, -1)
        if self.hidden is not None:
            self.hidden = self.hidden * (~new).repeat_interleave(a, 0).to(self.hidden.dtype)
        x = self.net.inputs(obs.obs, self.last).reshape(n * a, -1)
        qs, self.hidden = self.net.agent(x, self.hidden)
        self.last = select_actions(qs.float().view(n, a, -1), obs.avail, epsilon, generator)
        return self.last


class RandomActing:
    """Available actions uniformly at random (pretraining: the encoder learns the observations of
    the whole space)."""

    def __init__(self, device: torch.device):
        self.device = device

    def __call__(self, obs: MAObs, epsilon: float = 1.0) -> torch.Tensor:
        return select_actions(torch.zeros(obs.avail.shape, device=self.device), obs.avail, 1.0)


class SeenAs:
    """The env with every observation (final ones too) passed through ``view``: the full one
    (``full_obs=true``, the oracle) or the reconstructed one (``reconstruct=true``). The replay
    keeps what the agent saw, so a frozen reconstructer runs once per env step, not per update."""

    def __init__(self, env: MultiAgentVecEnv, view: Callable[[MAObs], MAObs]):
        self.env, self.view = env, view

    def __getattr__(self, name: str) -> Any:
        return getattr(self.env, name)

    def reset(self, seed: int | None = None) -> MAObs:
        return self.view(self.env.reset(seed))

    def step(self, actions: torch.Tensor) -> tuple[MAObs, torch.Tensor, torch.Tensor, torch.Tensor, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self.env.step(actions)
        return self.view(obs), reward, terminated, truncated, {**info, "final_obs": self.view(info["final_obs"])}


def full_sight(obs: MAObs) -> MAObs:
    return obs._replace(obs=obs.full, full=None)


def make_env(
    cfg: QMIXConfig, num_envs: int, seed: int, device: torch.device | str, reconstructer: torch.nn.Module | None = None
) -> MultiAgentVecEnv:
    """The stage's envs: ``task`` with ``env_kwargs``, seen with full sight where ``full_obs``,
    through ``reconstructer`` where given."""
    env = make_marl_env(cfg.task, num_envs, seed=seed, device=device, **cfg.env_options())
    if cfg.full_obs:
        return SeenAs(env, full_sight)
    return seen_through(env, reconstructer) if reconstructer is not None else env


def seen_through(env: MultiAgentVecEnv, reconstructer: torch.nn.Module) -> MultiAgentVecEnv:
    """``env`` whose agents see what ``reconstructer`` makes of their observations."""
    return SeenAs(env, lambda obs: obs._replace(obs=reconstructer(obs.obs)))


def reconstructer_of(
    cfg: QMIXConfig, state: dict[str, Any] | None, layout: NodeLayout | None, device: torch.device | str
) -> tuple[torch.nn.Module | None, dict[str, Any]]:
    """With ``reconstruct=true``: the frozen reconstructer (from a checkpoint's ``state`` of this
    stage, else from ``init_from``) and what this stage's checkpoints keep to rebuild it; else
    (None, {})."""
    if not cfg.reconstruct:
        return None, {}
    if state is not None:
        saved, source = state["reconstructer"], "the checkpoint"
    else:
        ckpt = load_checkpoint(cfg.init_from, expect_algo="qmix")
        saved, source = reconstructer_state(ckpt), f"init_from={cfg.init_from}"
    return build_reconstructer(saved, layout, source).to(device), {"reconstructer": saved}


def build_stage(
    rt: Runtime, cfg: QMIXConfig, run: Run, env: MultiAgentVecEnv
) -> tuple[dict[str, torch.nn.Module], QLearner | AutoencoderLearner, Acting | RandomActing]:
    """This stage's networks (resumed, or initialised from ``init_from``) and its learner, which
    wraps in DDP what the stage trains (collective: rank 0's weights broadcast, then checked),
    and how it acts while training."""
    nets = build_networks(cfg, env)  # before wrapping: DDP broadcasts rank 0's weights
    if run.resumed:
        load_networks(nets, run.state["networks"], "the resumed checkpoint")
    elif cfg.init_from and not cfg.reconstruct:  # a reconstructer's checkpoint has no networks of this stage
        names = init_from_checkpoint(nets, cfg.init_from)
        log.info("initialised %s from %s", ", ".join(names), cfg.init_from)
    learner: QLearner | AutoencoderLearner
    acting: Acting | RandomActing
    if cfg.stage == "pretrain":
        learner = AutoencoderLearner(rt, cfg, Autoencoder(nets["encoder"], nets["decoder"]))
        acting = RandomActing(rt.device)
    else:
        learner = QLearner(rt, cfg, q_network(cfg, env, nets))
        acting = Acting(learner.net)
    for module in nets.values():
        module.to(rt.device)  # a frozen encoder is no part of the wrapped module
    if run.resumed:
        learner.load_state_dict(run.state["learner"])
        learner.updates = run.counters["updates"]
    checksum = rt.check_in_sync(learner.model)
    log.info(
        "%s stage: trains %s (checksum %.6f over %d rank(s))%s",
        cfg.stage,
        trained_names(nets),
        checksum,
        rt.world_size,
        "; a frozen reconstructer fills in what agents cannot see" if cfg.reconstruct else "",
    )
    return nets, learner, acting


def build_replay(
    rt: Runtime, cfg: QMIXConfig, run: Run, fields: dict[str, Any], warmup_iterations: int
) -> tuple[EpisodeBuffer, int]:
    """This rank's episode replay, and the iterations of warm-up before the first update.
    Collective when resumed: the saved replays come back only when every rank finds its own
    (saved at this step; on another number of ranks, its share of all of them) and each holds a
    batch; then updates go on at once, else every rank warms up again."""
    buffer = EpisodeBuffer(cfg.local_buffer_size(rt.world_size), fields, rt.device)
    if not run.resumed:
        return buffer, warmup_iterations
    restored = (
        restore_buffer(buffer, Path(cfg.resume).parent, run.checkpoint, rt.rank, rt.world_size)
        and buffer.size >= cfg.batch_size
    )
    if rt.all_reduce_sum(int(restored)) == rt.world_size:
        log.info("resumed with the episode replays (%d episodes on rank 0)", buffer.size)
        return buffer, 0
    log.info("resumed without replays: %d steps per env of warm-up before updates", warmup_iterations)
    return EpisodeBuffer(cfg.local_buffer_size(rt.world_size), fields, rt.device), warmup_iterations


def run_eval(
    rt: Runtime,
    cfg: QMIXConfig,
    run: Run,
    learner: QLearner,
    env: MultiAgentVecEnv,
    reconstructer: torch.nn.Module | None,
) -> dict[str, float]:
    """Collective: greedy episodes of ``learner``'s network on fresh envs (split over ranks); global means."""
    eval_acting = Acting(learner.net)
    return run.evaluate(
        lambda n, s: make_env(cfg, n, seed=s, device=rt.device, reconstructer=reconstructer),
        eval_acting,
        env.extra_info_keys,
    )


def exploration(cfg: QMIXConfig, step: int) -> float:
    """Epsilon of the epsilon-greedy acting at global ``step`` (1: pretraining acts at random)."""
    if cfg.stage == "pretrain":
        return 1.0
    return epsilon_at(step, cfg.epsilon_start, cfg.epsilon_finish, cfg.epsilon_anneal_steps)


def train_metrics(
    rt: Runtime, cfg: QMIXConfig, window: Window, buffer: EpisodeBuffer, updates: int, step: int, epsilon: float
) -> dict[str, float]:
    """Collective: the row of ``step``: the window's global metrics, exploration, updates, the GPUs."""
    metrics = window.metrics(rt, step, buffer)
    metrics["train/epsilon"] = epsilon
    metrics["train/updates"] = float(updates)
    metrics["train/effective_batch_size"] = float(cfg.effective_batch_size(rt.world_size))
    metrics.update(system_metrics(rt))
    return metrics


# ---------------------------------------------------------------------------------------------
# the loop
# ---------------------------------------------------------------------------------------------


def train(rt: Runtime, cfg: QMIXConfig) -> None:
    """Train ``cfg.stage`` on ``cfg.task`` for ``cfg.steps`` global env steps (runs on every rank);
    the graph reconstructer's stages have their own loop (``pretrain.train``)."""
    if is_graph_stage(cfg.stage):
        from ddprl.algos.qmix import pretrain

        return pretrain.train(rt, cfg)
    # -- sizes: global in, local derived (docs/distributed.md, invariant 4) ------------------------
    local_num_envs = cfg.local_num_envs(rt.world_size)
    steps_per_iteration = local_num_envs * rt.world_size  # global env steps of one step of every env

    run = Run(rt, cfg)  # the checkpoint being resumed (if any), seeds, later the run directory
    env = make_env(cfg, local_num_envs, seed=run.env_seed, device=rt.device)
    layout = getattr(env, "node_layout", None)
    reconstructer, kept = reconstructer_of(cfg, run.state if run.resumed else None, layout, rt.device)
    if reconstructer is not None:
        env = seen_through(env, reconstructer)
    obs = env.reset(seed=run.env_seed)
    update_every = cfg.update_every or env.episode_limit
    warmup_iterations = cfg.warmup_iterations(env.episode_limit, rt.world_size)  # no update before
    nets, learner, acting = build_stage(rt, cfg, run, env)  # init_from / resume before wrapping
    run.restore_rank_state()

    fields = episode_fields(env.episode_limit, env.n_agents, env.obs_dim, env.state_dim, env.n_actions)
    buffer, warmup_iterations = build_replay(rt, cfg, run, fields, warmup_iterations)
    staging = EpisodeStaging(local_num_envs, fields, rt.device)

    def save(step: int, score: float | None) -> None:
        rt.check_in_sync(learner.model, "parameters at checkpoint")
        if cfg.checkpoint_buffer:  # each rank its own file, written before rank 0 writes latest.pt
            run.save_own_file(
                {"step": step, "buffer": buffer.state_dict()}, buffer_path(run_dir / "checkpoints", rt.rank)
            )
        state = {
            "networks": {name: strip_prefixes(m.state_dict()) for name, m in nets.items()},
            "learner": learner.state_dict(),
            **kept,
        }
        run.save(step, state, counters={"updates": learner.updates}, score=score)

    total_iterations = math.ceil((cfg.steps - run.step) / steps_per_iteration)
    run_dir = run.open(total_steps=run.step + total_iterations * steps_per_iteration)
    log.info(
        "run directory %s | %d ranks x %d envs | %d episodes per update (effective batch) | update every "
        "%d global env steps",
        run_dir,
        rt.world_size,
        local_num_envs,
        cfg.effective_batch_size(rt.world_size),
        update_every,
    )

    evaluates = cfg.stage != "pretrain" and cfg.eval_episodes > 0  # pretraining has no policy to evaluate
    global_step = run.step
    scheduled = global_step // update_every  # update slots passed (one update per slot)
    window = Window(rt.device, global_step, env.extra_info_keys)
    for iteration in range(total_iterations):
        # -- act and step every local env once (no collective) ----------------------------------
        t0 = time.perf_counter()
        epsilon = exploration(cfg, global_step)
        with run.split.phase("act"):
            actions = acting(obs, epsilon)
        with run.split.phase("env"):  # the step, and its transitions into the episodes and the replay
            next_obs, reward, terminated, truncated, info = env.step(actions)
            episodes = staging.record(obs, actions, reward, terminated, truncated, info["final_obs"])
            if episodes is not None:
                buffer.add(episodes)
                window.episodes(info, terminated | truncated)
        obs = next_obs
        global_step += steps_per_iteration
        window.collect_s += time.perf_counter() - t0

        # -- learner updates due by now (the same number on every rank) -------------------------
        t0 = time.perf_counter()
        due = global_step // update_every
        if iteration + 1 < warmup_iterations:
            scheduled = due  # warming up: those slots pass without an update
        elif iteration + 1 == warmup_iterations:
            run.step_cost_changes()  # the first updates (on every rank at this step)
        with run.split.phase("learn"):
            while scheduled < due:
                batches = [buffer.sample(cfg.batch_size) for _ in range(cfg.sync_freq)]
                window.learner(learner.update(batches))
                scheduled += 1
        window.update_s += time.perf_counter() - t0

        # -- bookkeeping: every number global (docs/distributed.md, invariant 7) -------------------
        last = iteration == total_iterations - 1
        evaluating = evaluates and (crossed(global_step, steps_per_iteration, cfg.eval_freq) or last)
        score = None
        if crossed(global_step, steps_per_iteration, cfg.log_freq) or evaluating or last:
            metrics = train_metrics(rt, cfg, window, buffer, learner.updates, global_step, epsilon)
            if evaluating:
                metrics.update(run_eval(rt, cfg, run, learner, env, reconstructer))
                score = metrics.get("eval/return_mean")
            run.log(global_step, metrics)
        else:
            run.progress(global_step)
        checkpoint_due = crossed(global_step, steps_per_iteration, cfg.checkpoint_freq)
        run.step_boundary(global_step, functools.partial(save, global_step), score, checkpoint_due, last)

    env.close()
    run.finish()  # rank 0 prints the summary block


def trained_names(nets: dict[str, torch.nn.Module]) -> str:
    """The modules this stage trains (the ones DDP wraps), for the log."""
    names = [n for n, m in nets.items() if any(p.requires_grad for p in m.parameters())]
    return ", ".join(names) or "nothing"


class Window:
    """What happened since the last metrics row, on this rank; :meth:`metrics` reduces it over ranks."""

    def __init__(self, device: torch.device, start_step: int, extra_keys: tuple[str, ...]):
        self.device = device
        self.start, self.start_step = time.perf_counter(), start_step
        self.episode_keys = ("episode_return", "episode_length", *extra_keys)
        self.reset()

    def reset(self) -> None:
        self.collect_s = self.update_s = 0.0
        # Every rank reduces the same keys, also a rank that ended no episode in this window.
        self.episode_sums = {key.removeprefix("episode_"): 0.0 for key in self.episode_keys}
        self.episode_count = 0
        self.learner_sums: dict[str, float] = {}
        self.updates = 0

    def episodes(self, info: dict[str, Any], ended: torch.Tensor) -> None:
        for key in self.episode_keys:
            self.episode_sums[key.removeprefix("episode_")] += float((info[key].float() * ended).sum())
        self.episode_count += int(ended.sum())

    def learner(self, metrics: dict[str, float]) -> None:
        for k, v in metrics.items():
            self.learner_sums[k] = self.learner_sums.get(k, 0.0) + v
        self.updates += 1

    def metrics(self, rt: Runtime, global_step: int, buffer: EpisodeBuffer) -> dict[str, float]:
        """Collective: the window's global metrics (one all-reduce), then a new window."""
        now = time.perf_counter()
        local = {
            "collect_s": self.collect_s,
            "update_s": self.update_s,
            "episodes": float(self.episode_count),
            "updates": float(self.updates),
            "buffer": float(buffer.size),
        }
        local.update({f"ep_{k}": v for k, v in self.episode_sums.items()})
        local.update({f"learn_{k}": v for k, v in self.learner_sums.items()})
        keys = sorted(local)  # the same on every rank: learner keys come with the same updates everywhere
        sums = rt.all_reduce_sum(torch.tensor([local[k] for k in keys], dtype=torch.float64, device=self.device))
        total = dict(zip(keys, sums.tolist(), strict=True))
        elapsed = now - self.start
        out: dict[str, float] = {}
        if elapsed > 0:
            out["time/global_fps"] = (global_step - self.start_step) / elapsed
            out["time/updates_per_s"] = total["updates"] / rt.world_size / elapsed
        out["time/collect_s"] = total["collect_s"] / rt.world_size
        out["time/update_s"] = total["update_s"] / rt.world_size
        out["train/buffer_episodes"] = total["buffer"]
        if total["episodes"] > 0:
            for k in keys:
                if k.startswith("ep_"):
                    out[f"train/episode_{k[3:]}"] = total[k] / total["episodes"]
        if total["updates"] > 0:
            for k in keys:
                if k.startswith("learn_"):
                    out[f"train/{k[6:]}"] = total[k] / total["updates"]
        self.start, self.start_step = now, global_step
        self.reset()
        return out


def load_actor(cfg: QMIXConfig, state: dict[str, Any], device: torch.device) -> Actor:
    """The greedy QMIX policy of a checkpoint's ``state`` (epsilon 0), for eval and play."""
    if cfg.stage == "pretrain":
        raise UsageError(
            "a stage=pretrain checkpoint holds an observation autoencoder, not a policy; "
            "train stage=qmix with init_from=<this checkpoint> and evaluate that"
        )

    probe = make_env(cfg, 1, seed=cfg.seed, device=device)
    reconstructer, _ = reconstructer_of(cfg, state, getattr(probe, "node_layout", None), device)

    def make(num_envs: int, seed: int):
        return make_env(cfg, num_envs, seed=seed, device=device, reconstructer=reconstructer)

    nets = build_networks(cfg, probe)
    load_networks(nets, state["networks"], "the checkpoint")
    net = q_network(cfg, probe, nets).to(device).eval()
    for module in nets.values():
        module.to(device)
    extra_keys = tuple(probe.extra_info_keys)
    probe.close()
    return Actor(make, Acting(net), extra_keys)
