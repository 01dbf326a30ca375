"""PPO's update: one optimizer step as ONE function of tensors (:class:`UpdateStep`), run
eagerly or compiled, and the epoch loop around it (:func:`learn`).

The step takes its own gradients and ends in :meth:`~ddprl.algos.graphs.FlatAdam.averaged_step_`
(one all-reduce of the flat gradient, clip, Adam) instead of DDP and ``optimizer.step()``, so
that a compiled step is one graph (docs/architecture.md, "How gradients are averaged"). N ranks
on N shares compute what one process computes on the whole batch (tests/test_ddp_equivalence.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
from torch.func import functional_call

from ddprl.algos.graphs import FlatAdam, compile_region, grad_with_aux, mark_static, step_begin
from ddprl.algos.ppo.loss import ppo_loss, standardize
from ddprl.algos.ppo.networks import ActorCritic
from ddprl.algos.ppo.rollout import RolloutBuffer

if TYPE_CHECKING:
    from ddprl.algos.ppo.config import PPOConfig
    from ddprl.runtime.collectives import Runtime

TERMS = ("loss", "policy_loss", "value_loss", "entropy", "approx_kl", "clip_frac")  # columns of a step's output


def update_batch(buffer: RolloutBuffer) -> dict[str, torch.Tensor]:
    """The flat batch (T*N samples) the update reads: views of the rollout storage, and two
    tensors of its own for ``advantages`` and ``returns`` (filled by :meth:`UpdateStep.load`)."""
    data = buffer.data
    n = data.rewards.numel()
    return {
        "obs": data.obs.flatten(0, 1),
        "actions": data.actions.flatten(0, 1),
        "log_probs": data.log_probs.flatten(),
        "values": data.values.flatten(),
        "advantages": torch.zeros(n, device=data.rewards.device),
        "returns": torch.zeros(n, device=data.rewards.device),
    }


class UpdateStep:
    """PPO's optimizer step on ``policy``'s parameters and ``optimizer``'s state.

    ``step(idx)`` with ``idx`` (k, B) takes k minibatches of ``batch`` (sample indices), sums
    their gradients / k (``sync_freq`` accumulation), averages them over ranks, clips their
    global norm to ``max_grad_norm`` and applies Adam, in place; returns the loss terms
    (k, len(TERMS)). ``compile``: the step is one compiled region (``region``); otherwise
    ``region`` is :meth:`step_eager` itself. ``functional`` (default: ``compile``) takes the
    gradients with ``torch.func`` (traceable) instead of autograd (cheaper eagerly).
    ``model``: the module the loss calls when the gradients are autograd's (a
    ``torch.compile``'d ``policy`` keeps the forward compiled where the step cannot be).

    ``scaler`` (precision=fp16): the loss is scaled, the averaged gradient unscaled, and a step
    whose gradient is not finite is skipped; that decision is a host read, so a step with an
    enabled scaler runs eagerly.

    >>> batch = update_batch(buffer)
    >>> update = UpdateStep(rt, policy, optimizer, batch, cfg, lambda x: x, nullcontext())  # doctest: +SKIP
    >>> update.load(advantages.flatten(), returns.flatten()); update.sync_lr()
    >>> terms = update.step(torch.randperm(n)[:2 * 64].view(2, 64))
    """

    def __init__(
        self,
        rt: Runtime,
        policy: ActorCritic,
        optimizer: torch.optim.Optimizer,
        batch: dict[str, torch.Tensor],
        cfg: PPOConfig,
        normalize: Callable,
        autocast: contextlib.AbstractContextManager,
        compile: bool = False,
        functional: bool | None = None,
        scaler: torch.amp.GradScaler | None = None,
        model: Callable | None = None,
    ):
        self.rt, self.policy, self.optimizer, self.batch = rt, policy, optimizer, batch
        self.normalize, self.autocast, self.cfg = normalize, autocast, cfg
        self.functional = compile if functional is None else functional
        self.scaler = scaler if scaler is not None and scaler.is_enabled() else None
        if compile and self.scaler is not None:
            raise ValueError("a gradient scaler skips steps on the host: the update with one runs eagerly")
        self.model = model if model is not None else policy
        # The learning rate as a device tensor: a Python float would be baked into the graph and
        # recompile it at every annealed value.
        self.adam = FlatAdam(optimizer, lr_tensors=True)
        device = self.adam.params[0].device
        names = {id(p): name for name, p in policy.named_parameters()}
        self.params = {names[id(p)]: p for p in self.adam.params}  # the optimizer's order
        mark_static(*self.adam.tensors(), *batch.values())
        self.grad_and_terms = grad_with_aux(self.loss, self.functional)
        # compile_cache=False as for TD-MPC2's update (graphs.Region), whose slowdown from a warm
        # cache was measured; this one, built the same way, was not measured with a warm cache
        self.region = (
            compile_region(self.step_eager, device, rt.world_size, name="ppo update", compile_cache=False)
            if compile
            else self.step_eager
        )

    def loss(
        self, params: dict[str, torch.Tensor], idx: torch.Tensor, advantages: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """PPO's loss on the minibatch ``idx`` (B,), whose ``advantages`` (B,) are given, as a
        function of ``params``; aux: the terms (len(TERMS),)."""
        # the advantages come as an argument (normalised per step or not): not gathered again
        b = {k: v[idx] for k, v in self.batch.items() if k != "advantages"}
        cfg = self.cfg
        obs = self.normalize(b["obs"].float())  # stored as bytes where they are pixels
        with self.autocast:
            # eagerly ``params`` are the module's own: the plain call is the same, and cheaper
            out = (
                functional_call(self.policy, params, (obs, b["actions"]))
                if self.functional
                else self.model(obs, b["actions"])
            )
        terms = ppo_loss(
            out,
            b["log_probs"],
            b["values"],
            advantages,
            b["returns"],
            cfg.clip_coef,
            cfg.clip_vloss,
            cfg.vf_coef,
            cfg.ent_coef,
        )
        loss = terms["loss"] if self.scaler is None else self.scaler.scale(terms["loss"])
        return loss, torch.stack([terms[k].detach().float() for k in TERMS])

    def step_eager(self, idx: torch.Tensor) -> torch.Tensor:
        """The step (see the class docstring); ``region`` is this function, compiled or not."""
        k = idx.shape[0]
        advantages = self.batch["advantages"][idx]  # (k, B)
        if self.cfg.norm_adv == "minibatch":
            # Over the optimizer step's global batch (k minibatches on every rank), as CleanRL
            # and SB3 normalise each minibatch: the same numbers on N ranks, with sync_freq or
            # without, as one process on the whole batch.
            advantages = standardize(advantages, self.rt.region_mean)
        total, rows = None, []  # the flat gradient summed over the k minibatches
        for j in range(k):  # unrolled: k is fixed per graph
            grads, terms = self.grad_and_terms(self.params, idx[j], advantages[j])
            flat = self.adam.flatten(list(grads.values()))
            total = flat if total is None else total + flat
            rows.append(terms)
        self.adam.averaged_step_(
            total / k, self.rt.region_mean, self.cfg.max_grad_norm, None if self.scaler is None else self.unscale_
        )
        return torch.stack(rows)

    def unscale_(self, grad: torch.Tensor) -> bool:
        """fp16: divide the flat gradient by the loss scale in place, update the scale; whether
        the gradient is finite (the same on every rank: the gradient is already averaged)."""
        for p, g in zip(self.adam.params, grad.split([p.numel() for p in self.adam.params])):
            p.grad = g.view_as(p)  # views: the scaler unscales ``grad`` itself
        self.scaler.unscale_(self.optimizer)
        finite = bool(torch.isfinite(grad).all())
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        return finite

    @torch.no_grad()
    def step(self, idx: torch.Tensor) -> torch.Tensor:
        step_begin(idx.device)
        return self.region(idx)

    @torch.no_grad()
    def load(self, advantages: torch.Tensor, returns: torch.Tensor) -> None:
        """This rollout's advantages and returns (T*N,) into the batch the step reads."""
        self.batch["advantages"].copy_(advantages)
        self.batch["returns"].copy_(returns)

    @torch.no_grad()
    def sync_lr(self) -> None:
        """Copy each param group's (annealed) ``lr`` into the tensor the step reads."""
        self.adam.sync_lr()


def learn(rt: Runtime, update: UpdateStep, cfg: PPOConfig) -> dict[str, float]:
    """PPO's update phase on this rank's batch (``update.batch``); returns global means.

    ``epochs`` passes, each one ``randperm`` cut in ``batch_size`` minibatches, one optimizer
    step per ``sync_freq`` of them (a shorter last group: a second graph when compiled). Every
    rank has the same number of samples, so the same steps and the same collectives; the KL
    early stop is decided on the KL averaged over ranks. The only host reads are the KL once
    per epoch and the metrics at the end.
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
        minibatches = perm[: num_minibatches * cfg.batch_size].view(num_minibatches, cfg.batch_size)
        epoch_sums = torch.zeros(len(TERMS), device=device)
        for group_start in range(0, num_minibatches, k):
            epoch_sums += update.step(minibatches[group_start : group_start + k]).sum(0)
        sums += epoch_sums
        epochs_done += 1
        if cfg.target_kl is not None:
            # Decided on the KL averaged over ranks: a per-rank decision would let one rank
            # leave the epoch loop while the others wait in its all-reduce (a deadlock).
            global_kl = rt.all_reduce_mean(float(epoch_sums[TERMS.index("approx_kl")]) / max(1, num_minibatches))
            if global_kl > cfg.target_kl:
                break
    count = max(1, epochs_done * num_minibatches)
    local = {f"train/{name}": value / count for name, value in zip(TERMS, sums.tolist())}
    local["train/epochs"] = float(epochs_done)
    return rt.all_reduce_mean(local)
