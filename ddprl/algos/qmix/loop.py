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
from pathlib import Path
from typing import Any

import torch

from ddprl.algos.common import crossed
from ddprl.algos.qmix.buffer import EpisodeBuffer, EpisodeStaging, episode_fields
from ddprl.algos.qmix.learner import AutoencoderLearner, QLearner, epsilon_at, select_actions
from ddprl.algos.qmix.networks import AgentNet, Autoencoder, Decoder, Encoder, QMixer, QNetwork, VDNMixer
from ddprl.checkpoint import buffer_path, load_checkpoint, restore_buffer, strip_prefixes
from ddprl.envs.marl import make_marl_env
from ddprl.envs.marl.base import MAObs
from ddprl.errors import UsageError
from ddprl.evaluate import Actor
from ddprl.run import Run
from ddprl.system import system_metrics

log = logging.getLogger("ddprl")


# ---------------------------------------------------------------------------------------------
# networks of a stage
# ---------------------------------------------------------------------------------------------


def build_networks(cfg: Any, env: Any) -> dict[str, torch.nn.Module]:
    """Every module the config describes for ``env`` (fresh weights from this rank's generator)."""
    nets: dict[str, torch.nn.Module] = {}
    features = env.obs_dim
    if cfg.encoder_dim > 0:
        nets["encoder"] = Encoder(env.obs_dim, cfg.hidden_dim, cfg.encoder_dim)
        features = cfg.encoder_dim
    if cfg.stage == "pretrain":
        nets["decoder"] = Decoder(cfg.encoder_dim, cfg.hidden_dim, env.obs_dim)
        return nets
    in_dim = features + (env.n_actions if cfg.obs_last_action else 0) + (env.n_agents if cfg.obs_agent_id else 0)
    nets["agent"] = AgentNet(in_dim, env.n_actions, cfg.hidden_dim, cfg.use_rnn)
    if cfg.mixer == "qmix":
        nets["mixer"] = QMixer(
            env.n_agents, env.state_dim, cfg.mixing_embed_dim, cfg.hypernet_layers, cfg.hypernet_embed
        )
    elif cfg.mixer == "vdn":
        nets["mixer"] = VDNMixer()
    return nets


def q_network(cfg: Any, env: Any, nets: dict[str, torch.nn.Module]) -> QNetwork:
    """The qmix stage's trained modules in one module; a frozen encoder stays outside it."""
    encoder = nets.get("encoder")
    frozen = encoder if encoder is not None and cfg.freeze_encoder else None
    if frozen is not None:
        frozen.requires_grad_(False)
    return QNetwork(
        nets["agent"],
        nets.get("mixer"),
        env.n_actions,
        cfg.obs_agent_id,
        cfg.obs_last_action,
        encoder=None if frozen is not None else encoder,
        frozen_encoder=frozen,
    )


def load_networks(
    nets: dict[str, torch.nn.Module], saved: dict[str, dict[str, torch.Tensor]], source: str, only_present: bool = False
) -> list[str]:
    """Load the saved modules into ``nets`` (by name); returns the names loaded.

    ``only_present``: modules the checkpoint lacks keep their weights (a stage initialised from
    an earlier stage, which trained fewer modules).
    """
    loaded = []
    for name, module in nets.items():
        if name not in saved:
            if only_present:
                continue
            raise UsageError(f"{source} has no {name} network")
        try:
            module.load_state_dict(saved[name])
        except RuntimeError as e:
            raise UsageError(
                f"{source}: its {name} network does not fit this config "
                f"({str(e).splitlines()[0][:160]}); use the same architecture keys"
            ) from None
        loaded.append(name)
    return loaded


def init_from_checkpoint(nets: dict[str, torch.nn.Module], path: str) -> list[str]:
    """Initialise this stage's modules from another stage's checkpoint (those it has)."""
    ckpt = load_checkpoint(path, expect_algo="qmix")
    names = load_networks(
        {k: v for k, v in nets.items() if k != "decoder"},
        ckpt["state"]["networks"],
        f"init_from={path}",
        only_present=True,
    )
    if not names:
        raise UsageError(f"init_from={path}: none of this stage's networks ({', '.join(nets)}) is in it")
    return names


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


# ---------------------------------------------------------------------------------------------
# the loop
# ---------------------------------------------------------------------------------------------


def train(rt: Any, cfg: Any) -> None:
    """Train ``cfg.stage`` on ``cfg.task`` for ``cfg.steps`` global env steps (runs on every rank)."""
    # -- sizes: global in, local derived (docs/distributed.md, invariant 4) ------------------------
    local_num_envs = cfg.local_num_envs(rt.world_size)
    steps_per_iteration = local_num_envs * rt.world_size  # global env steps of one step of every env

    run = Run(rt, cfg)  # the checkpoint being resumed (if any), seeds, later the run directory
    env = make_marl_env(cfg.task, local_num_envs, seed=run.env_seed, device=rt.device, **cfg.env_kwargs)
    obs = env.reset(seed=run.env_seed)
    update_every = cfg.update_every or env.episode_limit
    warmup_iterations = cfg.warmup_iterations(env.episode_limit, rt.world_size)  # no update before

    # -- networks: init_from / resume before wrapping (DDP broadcasts rank 0's weights) --------
    nets = build_networks(cfg, env)
    if run.resumed:
        load_networks(nets, run.state["networks"], "the resumed checkpoint")
    elif cfg.init_from:
        names = init_from_checkpoint(nets, cfg.init_from)
        log.info("initialised %s from %s", ", ".join(names), cfg.init_from)
    pretrain = cfg.stage == "pretrain"
    if pretrain:
        learner: QLearner | AutoencoderLearner = AutoencoderLearner(
            rt, cfg, Autoencoder(nets["encoder"], nets["decoder"])
        )
        acting = None  # random actions: the encoder learns the observations of the whole space
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
        "%s stage: trains %s (checksum %.6f over %d rank(s))", cfg.stage, trained_names(nets), checksum, rt.world_size
    )
    run.restore_rank_state()

    fields = episode_fields(env.episode_limit, env.n_agents, env.obs_dim, env.state_dim, env.n_actions)
    buffer = EpisodeBuffer(cfg.local_buffer_size(rt.world_size), fields, rt.device)
    staging = EpisodeStaging(local_num_envs, fields, rt.device)
    if run.resumed:
        # The saved replays come back only when every rank finds its own (saved at this step) and
        # each holds a batch; then updates go on at once, else every rank warms up again.
        restored = (
            restore_buffer(buffer, buffer_path(Path(cfg.resume).parent, rt.rank), run.checkpoint, rt.world_size)
            and buffer.size >= cfg.batch_size
        )
        if rt.all_reduce_sum(int(restored)) == rt.world_size:
            warmup_iterations = 0
            log.info("resumed with the episode replays (%d episodes on rank 0)", buffer.size)
        else:
            buffer = EpisodeBuffer(cfg.local_buffer_size(rt.world_size), fields, rt.device)
            log.info("resumed without replays: %d steps per env of warm-up before updates", warmup_iterations)

    def save(step: int, score: float | None) -> None:
        rt.check_in_sync(learner.model, "parameters at checkpoint")
        if cfg.checkpoint_buffer:  # each rank its own file, written before rank 0 writes latest.pt
            run.save_own_file(
                {"step": step, "buffer": buffer.state_dict()}, buffer_path(run_dir / "checkpoints", rt.rank)
            )
        state = {
            "networks": {name: strip_prefixes(m.state_dict()) for name, m in nets.items()},
            "learner": learner.state_dict(),
        }
        run.save(step, state, counters={"updates": learner.updates}, score=score)

    def run_eval(step: int) -> dict[str, float]:
        eval_acting = Acting(learner.net)
        return run.evaluate(
            lambda n, s: make_marl_env(cfg.task, n, seed=s, device=rt.device, **cfg.env_kwargs),
            eval_acting,
            env.extra_info_keys,
        )

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

    global_step = run.step
    scheduled = global_step // update_every  # update slots passed (one update per slot)
    window = Window(rt.device, global_step, env.extra_info_keys)
    for iteration in range(total_iterations):
        # -- act and step every local env once (no collective) ----------------------------------
        t0 = time.perf_counter()
        epsilon = (
            1.0
            if pretrain
            else epsilon_at(global_step, cfg.epsilon_start, cfg.epsilon_finish, cfg.epsilon_anneal_steps)
        )
        with run.split.phase("act"):
            if acting is None:
                actions = select_actions(torch.zeros(obs.avail.shape, device=rt.device), obs.avail, 1.0)
            else:
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
        evaluating = (
            not pretrain
            and cfg.eval_episodes > 0
            and (crossed(global_step, steps_per_iteration, cfg.eval_freq) or last)
        )
        if crossed(global_step, steps_per_iteration, cfg.log_freq) or evaluating or last:
            metrics = window.metrics(rt, global_step, buffer)
            metrics["train/epsilon"] = epsilon
            metrics["train/updates"] = float(learner.updates)
            metrics["train/effective_batch_size"] = float(cfg.effective_batch_size(rt.world_size))
            metrics.update(system_metrics(rt))
            if evaluating:
                metrics.update(run_eval(global_step))
            run.log(global_step, metrics)
        else:
            run.progress(global_step)
        run.step_boundary(
            global_step,
            functools.partial(save, global_step),
            score=metrics.get("eval/return_mean") if evaluating else None,
            due=crossed(global_step, steps_per_iteration, cfg.checkpoint_freq),
            last=last,
        )

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

    def metrics(self, rt: Any, global_step: int, buffer: EpisodeBuffer) -> dict[str, float]:
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


def load_actor(cfg: Any, state: dict[str, Any], device: torch.device) -> Actor:
    """The greedy QMIX policy of a checkpoint's ``state`` (epsilon 0), for eval and play."""
    if cfg.stage == "pretrain":
        raise UsageError(
            "a stage=pretrain checkpoint holds an observation autoencoder, not a policy; "
            "train stage=qmix with init_from=<this checkpoint> and evaluate that"
        )

    def make(num_envs: int, seed: int):
        return make_marl_env(cfg.task, num_envs, seed=seed, device=device, **cfg.env_kwargs)

    probe = make(1, cfg.seed)
    nets = build_networks(cfg, probe)
    load_networks(nets, state["networks"], "the checkpoint")
    net = q_network(cfg, probe, nets).to(device).eval()
    for module in nets.values():
        module.to(device)
    extra_keys = tuple(probe.extra_info_keys)
    probe.close()
    return Actor(make, Acting(net), extra_keys)
