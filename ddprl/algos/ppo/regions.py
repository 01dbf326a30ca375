"""PPO's compiled regions (``compile=true``): the rollout and the optimizer step, each one graph.

The issue "Snake / PPO on device": with thousands of on-device envs the environment is not the
cost (Snake alone: 38M steps/s on an H100) — the per-step Python loop and its hundreds of
small kernels are. So the hot paths are written as *regions* (``ddprl.algos.graphs``), each
compiled whole with ``fullgraph=True`` and, on one CUDA device, replayed as a CUDA graph:

- :class:`CompiledRollout`: ``unroll`` env steps per graph — act, ``env.advance``, V(final_obs),
  store, episode sums — for envs whose step traces (``env.traceable_step``: Snake). The random
  draws (the policy's noise, the env's integers) are filled in place before each replay, from
  the training generator and the env's own generator: inputs, not random ops inside the graph.
- :class:`CompiledUpdate`: one optimizer step — ``sync_freq`` minibatches' gradients
  (``torch.func``), their mean over ranks (``rt.region_mean``, one all-reduce), the norm
  clip and Adam on the state of the ordinary ``torch.optim.Adam`` (checkpoints unchanged).

Everything a region reads or writes across calls lives at a fixed address, marked static:
rollout storage, env state, optimizer state, the batch, the noise; a region's outputs are
small and consumed before the next replay. Host reads (the KL early stop, metrics) happen
between regions (``loop.learn_compiled``).
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any, Callable, NamedTuple

import torch
from torch.func import functional_call, grad_and_value

from ddprl.algos.graphs import (FlatAdam, clip_grad, compile_region, mark_static, step_begin,
                                training_step_unsupported)
from ddprl.algos.ppo.loss import ppo_loss
from ddprl.algos.ppo.networks import ActorCritic
from ddprl.algos.ppo.rollout import RolloutBuffer

log = logging.getLogger("ddprl")

TERMS = ("loss", "policy_loss", "value_loss", "entropy", "approx_kl", "clip_frac")  # columns of a step's output


class Plan(NamedTuple):
    """What ``compile=true`` runs as regions in this job."""

    update: bool  # the optimizer step as one graph (else eager ``learn`` on the compiled DDP model)
    unroll: int  # env steps per rollout graph (0: eager rollout loop with a compiled ``act``)


def plan(cfg: Any, env: Any) -> Plan:
    """The regions for ``cfg`` and ``env``; logs one line naming what stays out and why.

    ``compile_unroll`` is a ceiling: the rollout region takes the largest divisor of ``n_steps``
    not above it, so that every replay runs the same graph.
    """
    if not cfg.compile:
        return Plan(update=False, unroll=0)
    unsupported = training_step_unsupported()  # an old torch: the eager update on the compiled model
    update = cfg.precision != "fp16" and unsupported is None
    unroll, left_out = 0, []
    if getattr(env, "traceable_step", False):
        unroll = max(d for d in range(1, min(cfg.compile_unroll, cfg.n_steps) + 1) if cfg.n_steps % d == 0)
    else:
        left_out.append(f"the rollout compiles only the policy ({type(env).__name__} steps outside a graph)")
    if not update:
        why = unsupported or "precision=fp16: GradScaler skips steps on the host"
        left_out.insert(0, f"the update runs eagerly on the compiled model ({why})")
    compiled = ([f"rollout as graphs of {unroll} env steps"] if unroll else []) + (
        ["update as one graph per optimizer step"] if update else [])
    log.info("compile=true: %s", "; ".join([", ".join(compiled) or "torch.compile of the model", *left_out]))
    return Plan(update=update, unroll=unroll)


class CompiledRollout:
    """A rollout of an env whose step traces, ``unroll`` steps per replay of one graph.

    Writes the same :class:`RolloutBuffer` as the eager loop (rows ``0..n_steps-1``, a device
    cursor instead of a Python index) and returns the episode sums the loop logs.

    >>> rollout = CompiledRollout(env, policy, buffer, lambda x: x, nullcontext(), unroll=8)  # doctest: +SKIP
    >>> ep_return_sum, ep_count = rollout.collect()      # buffer.n_steps env steps, 0-d tensors
    """

    def __init__(self, env: Any, policy: ActorCritic, buffer: RolloutBuffer, normalize: Callable,
                 autocast: contextlib.AbstractContextManager, unroll: int, compile: bool = True):
        if buffer.n_steps % unroll:
            raise ValueError(f"unroll={unroll} must divide n_steps={buffer.n_steps}")
        device = env.device
        self.env, self.policy, self.buffer, self.normalize, self.autocast = env, policy, buffer, normalize, autocast
        self.unroll, self.device = unroll, device
        self.cursor = torch.zeros(1, dtype=torch.long, device=device)  # buffer row of the next step
        self.action_noise = torch.empty(unroll, env.num_envs, *policy.noise_shape, device=device)
        self.env_noise = torch.empty(unroll, *env.draw_shape, dtype=torch.long, device=device)
        mark_static(self.cursor, self.action_noise, self.env_noise, *buffer.data,
                    *(t for t in vars(env).values() if isinstance(t, torch.Tensor)))
        self.region = compile_region(self.steps, device, name="ppo rollout") if compile else self.steps

    def steps(self, action_noise: torch.Tensor, env_noise: torch.Tensor) -> torch.Tensor:
        """The region: ``unroll`` steps from the env's current state, stored at the cursor.

        ``action_noise`` (K, N, *noise_shape), ``env_noise`` (K, *draw_shape). Returns (2,): the
        summed returns of the episodes that ended, and their count.
        """
        obs = self.env.observe()
        finished = torch.zeros(2, device=self.device)
        for j in range(self.unroll):  # unrolled: K copies of the step in one graph
            with self.autocast:
                action, log_prob, value = self.policy.act_with_noise(self.normalize(obs), action_noise[j])
            next_obs, reward, terminated, truncated, info = self.env.advance(action, env_noise[j])
            # V(final_obs) bootstraps truncated episodes; computed for every env, since asking
            # whether any was truncated would be a host read.
            with self.autocast:
                final_values = self.policy.value(self.normalize(info["final_obs"])).float()
            self.buffer.store(self.cursor + j, obs=obs, actions=action, log_probs=log_prob, values=value,
                              rewards=reward, terminated=terminated, truncated=truncated, final_values=final_values)
            done = terminated | truncated
            finished = finished + torch.stack([(info["episode_return"] * done).sum(), done.sum().float()])
            obs = next_obs
        self.cursor.add_(self.unroll)
        return finished

    @torch.no_grad()
    def collect(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``buffer.n_steps`` steps of every env: n_steps / unroll replays. Returns the summed
        returns of the episodes that ended and their count (0-d device tensors)."""
        self.cursor.zero_()
        finished = torch.zeros(2, device=self.device)
        for _ in range(self.buffer.n_steps // self.unroll):
            self.policy.fill_noise_(self.action_noise)
            self.env.draw_into(self.env_noise)
            step_begin(self.device)
            finished += self.region(self.action_noise, self.env_noise)  # read before the next replay reuses it
        return finished[0], finished[1]


def update_batch(buffer: RolloutBuffer) -> dict[str, torch.Tensor]:
    """The flat batch (T*N samples) the update region reads: views of the rollout storage, and
    two tensors of its own for ``advantages`` and ``returns`` (filled by :meth:`CompiledUpdate.load`)."""
    data = buffer.data
    n = data.rewards.numel()
    return {"obs": data.obs.flatten(0, 1), "actions": data.actions.flatten(0, 1), "log_probs": data.log_probs.flatten(),
            "values": data.values.flatten(), "advantages": torch.zeros(n, device=data.rewards.device),
            "returns": torch.zeros(n, device=data.rewards.device)}


class CompiledUpdate:
    """PPO's optimizer step as one graph, on ``policy``'s parameters and ``optimizer``'s state.

    ``step(idx)`` with ``idx`` (k, B) takes k minibatches of ``batch`` (sample indices), sums their
    gradients / k (the eager loop's ``sync_freq`` accumulation), averages them over ranks, clips
    their global norm to ``max_grad_norm`` and applies Adam, in place; returns the loss terms
    (k, len(TERMS)). The learning rate is read from ``optimizer.param_groups`` by :meth:`sync_lr`.

    >>> batch = update_batch(buffer)                                           # doctest: +SKIP
    >>> update = CompiledUpdate(rt, policy, optimizer, batch, cfg, lambda x: x, nullcontext())  # doctest: +SKIP
    >>> update.load(advantages.flatten(), returns.flatten()); update.sync_lr()
    >>> terms = update.step(torch.randperm(n)[:2 * 64].view(2, 64))
    """

    def __init__(self, rt: Any, policy: ActorCritic, optimizer: torch.optim.Optimizer, batch: dict[str, torch.Tensor],
                 cfg: Any, normalize: Callable, autocast: contextlib.AbstractContextManager, compile: bool = True):
        self.rt, self.policy, self.optimizer, self.batch = rt, policy, optimizer, batch
        self.normalize, self.autocast, self.cfg = normalize, autocast, cfg
        # The learning rate as a device tensor: a Python float would be baked into the graph and
        # recompile it at every annealed value.
        self.adam = FlatAdam(optimizer, lr_tensors=True)
        device = self.adam.params[0].device
        names = {id(p): name for name, p in policy.named_parameters()}
        self.params = {names[id(p)]: p for p in self.adam.params}  # the optimizer's order
        mark_static(*self.adam.tensors(), *batch.values())
        self.grad_and_terms = grad_and_value(self.loss, has_aux=True)
        self.region = (compile_region(self.step_eager, device, rt.world_size, name="ppo update") if compile
                       else self.step_eager)

    def loss(self, params: dict[str, torch.Tensor], idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """PPO's loss on the minibatch ``idx`` (B,) as a function of ``params``; aux: the terms (len(TERMS),)."""
        b, cfg = {k: v[idx] for k, v in self.batch.items()}, self.cfg
        obs = self.normalize(b["obs"])
        with self.autocast:
            out = functional_call(self.policy, params, (obs, b["actions"]))
        terms = ppo_loss(out, b["log_probs"], b["values"], b["advantages"], b["returns"],
                         cfg.clip_coef, cfg.clip_vloss, cfg.vf_coef, cfg.ent_coef)
        return terms["loss"], torch.stack([terms[k].detach().float() for k in TERMS])

    def step_eager(self, idx: torch.Tensor) -> torch.Tensor:
        """The region (see the class docstring); ``step`` is its compiled form."""
        k = idx.shape[0]
        total, rows = None, []  # the flat gradient summed over the k minibatches
        for j in range(k):  # unrolled: k is fixed per graph
            grads, (_, terms) = self.grad_and_terms(self.params, idx[j])
            flat = self.adam.flatten(list(grads.values()))
            total = flat if total is None else total + flat
            rows.append(terms)
        grad = self.rt.region_mean(total / k)
        if self.cfg.max_grad_norm > 0:
            grad, _ = clip_grad(grad, self.cfg.max_grad_norm)
        self.adam.step_(grad)
        return torch.stack(rows)

    @torch.no_grad()
    def step(self, idx: torch.Tensor) -> torch.Tensor:
        step_begin(idx.device)
        return self.region(idx)

    @torch.no_grad()
    def load(self, advantages: torch.Tensor, returns: torch.Tensor) -> None:
        """This rollout's advantages and returns (T*N,) into the batch the region reads."""
        self.batch["advantages"].copy_(advantages)
        self.batch["returns"].copy_(returns)

    @torch.no_grad()
    def sync_lr(self) -> None:
        """Copy each param group's (annealed) ``lr`` into the tensor the region reads."""
        self.adam.sync_lr()
