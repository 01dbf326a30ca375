"""TD-MPC2's learner on one rank: world model + policy, their optimizers, the Q scale, and
one update as ONE function of tensors (docs/references.md#losses).

:class:`UpdateStep` takes its gradients with ``torch.func`` (autograd when eager) and ends each
half in :meth:`~ddprl.algos.graphs.FlatAdam.averaged_step_` (one all-reduce of the flat
gradient, clip, Adam), so that ``compile=true`` captures the whole update as one graph, a CUDA
graph on one GPU (docs/architecture.md, "How gradients are averaged"). N ranks on N batches
compute what one process computes on the joined batch (tests/test_tdmpc2_loop.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

import torch
from torch.func import functional_call

from ddprl.algos.common import autocast_context
from ddprl.algos.graphs import (
    FlatAdam,
    compile_region,
    grad_with_aux,
    keep,
    mark_static,
    step_begin,
    training_step_unsupported,
)
from ddprl.algos.tdmpc2.buffer import TrajectoryBatch
from ddprl.algos.tdmpc2.loss import policy_loss, world_model_loss
from ddprl.algos.tdmpc2.math import RunningScale
from ddprl.algos.tdmpc2.networks import ModelDims, WorldModel, dims_for_model_size
from ddprl.checkpoint import strip_prefixes
from ddprl.errors import UsageError

if TYPE_CHECKING:
    from ddprl.algos.tdmpc2.config import TDMPC2Config
    from ddprl.runtime.collectives import Runtime


def model_dims(cfg: TDMPC2Config) -> ModelDims:
    """The table's dims for ``model_size``, with any dim the config sets overriding it."""
    table = dims_for_model_size(cfg.model_size)
    return ModelDims(
        **{
            name: getattr(cfg, name) if getattr(cfg, name) is not None else getattr(table, name)
            for name in ModelDims.__dataclass_fields__
        }
    )


class UpdateNoise(NamedTuple):
    """The randomness of one micro-batch update, drawn outside it so that it can be fixed.

    The Q members come from a generator every rank seeds alike: all ranks use the same pair,
    so N ranks on N batches compute what one process on the joined batch would.
    """

    members_td: torch.Tensor  # (2,) target-Q members whose min is the TD target
    members_pi: torch.Tensor  # (2,) Q members averaged by the policy loss
    eps_td: torch.Tensor | None = None  # (H, B, A) policy noise at the next latents (None: rank's RNG)
    eps_pi: torch.Tensor | None = None  # (H+1, B, A) policy noise of the policy loss


def draw_noise(shared: torch.Generator, num_q: int, device: torch.device) -> UpdateNoise:
    """Q-member pairs from the shared generator (on ``device``: no host sync)."""
    pairs = [torch.randperm(num_q, generator=shared, device=device)[:2] for _ in range(2)]
    return UpdateNoise(pairs[0], pairs[1])


class UpdateStep:
    """One optimizer step of world model, then policy, on k stacked micro-batches.

    World model: the gradient of each micro-batch's loss / k, summed, averaged over ranks,
    clipped, one Adam step. Then the Q scale takes one EMA step on the first-latent Qs of
    every micro-batch of every rank (gathered: the step one process takes on the whole batch;
    as in TD-MPC2, the scale is updated before the loss uses it). Policy: on the detached
    latents of those passes, against the *updated* Qs, the same way; then the target Qs
    soft-update. Returns the metrics of :attr:`names` as one device tensor.
    """

    def __init__(
        self,
        rt: Runtime,
        model: WorldModel,
        scale: RunningScale,
        wm_optim: torch.optim.Optimizer,
        pi_optim: torch.optim.Optimizer,
        cfg: TDMPC2Config,
        functional: bool = True,
    ):
        self.rt, self.model, self.scale, self.cfg = rt, model, scale, cfg
        self.functional = functional  # torch.func gradients (compiled) or autograd (eager: faster there)
        self.wm_adam, self.pi_adam = FlatAdam(wm_optim), FlatAdam(pi_optim)
        # everything the region updates in place stays where it is (CUDA graphs: see mark_static)
        mark_static(*self.wm_adam.tensors(), *self.pi_adam.tensors(), *model.buffers(), *scale.buffers())
        name_of = {id(p): n for n, p in model.named_parameters()}
        # parameter names in the optimizers' order: gradients come back in that order
        self.wm_names = [name_of[id(p)] for p in self.wm_adam.params]
        self.pi_names = [name_of[id(p)].removeprefix("policy.") for p in self.pi_adam.params]
        clip = cfg.grad_clip_norm > 0
        self.names = (
            ["train/loss", "train/consistency", "train/reward", "train/value"]
            + ["train/grad_norm"] * clip
            + ["train/pi_loss", "train/pi_q", "train/pi_entropy"]
            + ["train/pi_grad_norm"] * clip
            + ["train/pi_scale"]
        )

    def call(self, module: torch.nn.Module, params: dict[str, torch.Tensor], *args: Any) -> Any:
        """``module(*args)`` as a function of ``params`` (for ``torch.func``); eager, the
        parameters are the module's own, so the plain call is the same and cheaper."""
        return functional_call(module, params, args) if self.functional else module(*args)

    def __call__(
        self,
        obs: torch.Tensor,
        action: torch.Tensor,
        reward: torch.Tensor,
        terminated: torch.Tensor,
        members_td: torch.Tensor,
        members_pi: torch.Tensor,
        eps_td: torch.Tensor | None,
        eps_pi: torch.Tensor | None,
        discount: float,
    ) -> torch.Tensor:
        """obs (k, H+1, B, O), action (k, H, B, A), reward/terminated (k, H, B, 1), members (k, 2),
        eps_td (k, H, B, A) / eps_pi (k, H+1, B, A) or None (drawn from the global RNG)."""
        model, cfg, rt, k = self.model, self.cfg, self.rt, obs.shape[0]
        autocast = autocast_context(obs.device, cfg.precision)
        params = dict(model.named_parameters())
        metrics: dict[str, torch.Tensor] = {}

        def add(name: str, value: torch.Tensor) -> None:
            metrics[name] = metrics.get(name, 0.0) + value.detach().float() / k

        # -- world model ------------------------------------------------------------------------
        def wm_loss(wm_params: dict[str, torch.Tensor], i: int):
            with autocast:
                out = self.call(
                    model,
                    wm_params,
                    obs[i],
                    action[i],
                    reward[i],
                    terminated[i],
                    discount,
                    members_td[i],
                    None if eps_td is None else eps_td[i],
                )
            terms = world_model_loss(out, reward[i], cfg.rho, cfg.consistency_coef, cfg.reward_coef, cfg.value_coef)
            return terms["loss"] / k, (terms, out["z"].detach())

        wm_params = {n: params[n] for n in self.wm_names}
        wm_grad: torch.Tensor | None = None  # flat, summed over the micro-batches
        latents = []
        for i in range(k):
            grads, (terms, z) = grad_with_aux(wm_loss, self.functional)(wm_params, i)
            flat = self.wm_adam.flatten([grads[n] for n in self.wm_names])
            wm_grad = flat if wm_grad is None else wm_grad + flat
            latents.append(z)  # (H+1, B, d): the policy learns on these
            for name in ("loss", "consistency", "reward", "value"):
                add(f"train/{name}", terms[name])
        norm = self.wm_adam.averaged_step_(wm_grad, rt.region_mean, cfg.grad_clip_norm)
        if norm is not None:
            metrics["train/grad_norm"] = norm

        # -- the Q scale, on the policy noise the loss below uses ---------------------------------
        eps = [
            eps_pi[i]
            if eps_pi is not None
            else torch.randn(z.shape[:-1] + (model.action_dim,), device=z.device, dtype=z.dtype)
            for i, z in enumerate(latents)
        ]
        with torch.no_grad(), autocast:
            q_first = torch.cat(
                [
                    model.Q(z[0], model.policy(z[0], e[0])[0], "avg", members=members_pi[i]).flatten()
                    for i, (z, e) in enumerate(zip(latents, eps))
                ]
            )
        self.scale.update(rt.region_all_gather(q_first.float()))

        # -- policy -------------------------------------------------------------------------------
        def pi_loss(pi_params: dict[str, torch.Tensor], i: int):
            with autocast:
                a, info = self.call(model.policy, pi_params, latents[i], eps[i])
                q = model.Q(latents[i], a, "avg", detach=True, members=members_pi[i])  # (H+1, B, 1)
            terms = policy_loss(q, info["scaled_entropy"], self.scale.value, cfg.rho, cfg.entropy_coef)
            return terms["loss"] / k, terms

        pi_params = {n: params[f"policy.{n}"] for n in self.pi_names}
        pi_grad: torch.Tensor | None = None
        for i in range(k):
            grads, terms = grad_with_aux(pi_loss, self.functional)(pi_params, i)
            flat = self.pi_adam.flatten([grads[n] for n in self.pi_names])
            pi_grad = flat if pi_grad is None else pi_grad + flat
            for name in ("loss", "q", "entropy"):
                add(f"train/pi_{name}", terms[name])
        norm = self.pi_adam.averaged_step_(pi_grad, rt.region_mean, cfg.grad_clip_norm)
        if norm is not None:
            metrics["train/pi_grad_norm"] = norm
        model.soft_update_target(cfg.tau)
        metrics["train/pi_scale"] = self.scale.value.reshape(())
        return torch.stack([metrics[name].float().reshape(()) for name in self.names])


@dataclass
class Learner:
    """Everything one optimizer step touches, on one rank: the plain ``model`` (acting,
    targets, checkpoints), the Q ``scale`` (identical on every rank), the two optimizers
    (their state, in ``torch.optim.Adam``'s format) and ``step``, the update (compiled or not)."""

    model: WorldModel
    scale: RunningScale  # running 5-95% range of Q, identical on every rank (reduced)
    wm_optim: torch.optim.Optimizer
    pi_optim: torch.optim.Optimizer
    # what the loop calls: the UpdateStep, or with compile=true a Region around it (its ``fn``)
    step: Callable[..., torch.Tensor]
    names: list[str]  # the metrics of ``step``'s output tensor, in order

    def state_dict(self) -> dict[str, Any]:
        return {
            "model": strip_prefixes(self.model.state_dict()),
            "wm_optimizer": self.wm_optim.state_dict(),
            "pi_optimizer": self.pi_optim.state_dict(),
            "scale": self.scale.state_dict(),
        }


def build_learner(
    rt: Runtime, cfg: TDMPC2Config, obs_dim: int, action_dim: int, state: dict[str, Any] | None = None
) -> Learner:
    """World model + policy on the rank's device, their optimizers, the Q scale, the update.

    Fresh: rank 0's weights are broadcast, then the target Qs are copied from them
    (docs/distributed.md, invariant 2). Resumed: every rank loads the same checkpoint, targets
    included.
    """
    if cfg.compile and training_step_unsupported():
        raise UsageError(f"{training_step_unsupported()}: use compile=false, or a torch that can")
    model = WorldModel(obs_dim, action_dim, dims=model_dims(cfg), dropout=cfg.dropout)
    if state is not None:
        model.load_state_dict(state["model"])
    model.to(rt.device)
    rt.broadcast_module(model)
    if state is None:
        model.make_target()  # after the broadcast: rank 0's weights, not this rank's init
    scale = RunningScale(tau=cfg.tau).to(rt.device)
    wm_optim = torch.optim.Adam(model.world_model_param_groups(cfg.lr, cfg.enc_lr_scale), lr=cfg.lr)
    pi_optim = torch.optim.Adam(model.policy.parameters(), lr=cfg.lr, eps=1e-5)
    if state is not None:
        wm_optim.load_state_dict(state["wm_optimizer"])
        pi_optim.load_state_dict(state["pi_optimizer"])
        scale.load_state_dict(state["scale"])
    eager = UpdateStep(rt, model, scale, wm_optim, pi_optim, cfg, functional=cfg.compile)
    step = (
        compile_region(eager, rt.device, rt.world_size, name="tdmpc2 update", compile_cache=False)
        if cfg.compile
        else eager
    )
    return Learner(model, scale, wm_optim, pi_optim, step, eager.names)


def update(
    rt: Runtime,
    learner: Learner,
    batches: list[TrajectoryBatch],
    noises: list[UpdateNoise],
    cfg: TDMPC2Config,
    discount: float,
) -> torch.Tensor:
    """One optimizer step of world model, then policy, on k = len(batches) micro-batches
    (:class:`UpdateStep`); returns the terms averaged over micro-batches as ONE device tensor
    in ``learner.names`` order (no host sync here: ``dict(zip(learner.names, values))`` names them)."""

    def stacked(values: list[torch.Tensor | None]) -> torch.Tensor | None:
        return None if values[0] is None else torch.stack(values)

    learner.model.train()
    step_begin(rt.device)
    with torch.no_grad():  # the region takes its own gradients (grad_with_aux); parameters change in place
        values = learner.step(
            *(torch.stack(t) for t in zip(*batches)),
            torch.stack([n.members_td for n in noises]),
            torch.stack([n.members_pi for n in noises]),
            stacked([n.eps_td for n in noises]),
            stacked([n.eps_pi for n in noises]),
            discount,
        )
    return keep(values)  # a CUDA graph's output is overwritten by its next replay
