"""TD-MPC2 networks (Hansen, Wang, Su, ICLR 2024): world model, Q ensemble, policy prior.

Facts (sizes, layers, init): docs/references.md#architecture. Notation: B batch, H horizon,
Q ensemble members, d latent_dim, A action_dim, h mlp_dim, K = 101 bins.

Training design (``learner.py``)
--------------------------------
TD-MPC2 makes two updates per step: the world-model loss (encoder, dynamics, reward, Qs) and
then the policy loss (policy prior only, against the *updated* Qs). They touch disjoint
trainable parameters; the learner takes the gradient of each with ``torch.func`` over
:meth:`WorldModel.forward` (everything the world-model loss needs, in one call) and over
``model.policy``, so that a whole update is one compiled graph::

    out = model(obs, action, reward, terminated, discount)   # dict, see WorldModel.forward
    ... world-model loss from out; grads of the encoder, dynamics, reward and Q parameters ...
    action, info = model.policy(out["z"].detach())            # policy on detached latents
    q = model.Q(out["z"].detach(), action, "avg", detach=True)  # Q params get no grad
    ... policy loss; grads of the policy parameters; model.soft_update_target(0.01) ...

The target Q copy is a set of buffers (never trainable), created at construction so state
dicts always hold it; ``make_target()`` refreshes it from the online Qs after rank 0's
weights were broadcast (the official code's distributed branch copies before the broadcast,
so its ranks start with different targets: docs/references.md#the-official-distributed-branch).

The Q ensemble is computed in one batched call over members: weights are stacked with shape
(Q, in, out), the first layer is one einsum for all members and later layers one baddbmm.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from ddprl.algos.layers import OutputLinear

from .math import NUM_BINS, gaussian_log_prob, squash_log_std, squashed_gaussian_sample, two_hot_inv

# --------------------------------------------------------------------------- sizes


@dataclass(frozen=True)
class ModelDims:
    """Widths of one TD-MPC2 model size (docs/references.md#architecture, model sizes)."""

    enc_dim: int
    mlp_dim: int
    latent_dim: int
    num_enc_layers: int
    num_q: int


MODEL_SIZES: dict[int, ModelDims] = {
    1: ModelDims(enc_dim=256, mlp_dim=384, latent_dim=128, num_enc_layers=2, num_q=2),
    5: ModelDims(enc_dim=256, mlp_dim=512, latent_dim=512, num_enc_layers=2, num_q=5),
    19: ModelDims(enc_dim=1024, mlp_dim=1024, latent_dim=768, num_enc_layers=3, num_q=5),
    48: ModelDims(enc_dim=1792, mlp_dim=1792, latent_dim=768, num_enc_layers=4, num_q=5),
    317: ModelDims(enc_dim=4096, mlp_dim=4096, latent_dim=1376, num_enc_layers=5, num_q=8),
}


def dims_for_model_size(size: int) -> ModelDims:
    """Dimensions for a model size in millions of parameters (the paper's names).

    >>> dims_for_model_size(5).latent_dim
    512
    """
    if size not in MODEL_SIZES:
        valid = ", ".join(str(s) for s in MODEL_SIZES)
        raise ValueError(f"model_size must be one of {valid}; got {size!r}")
    return MODEL_SIZES[size]


# --------------------------------------------------------------------------- layers


class _MishFromExp(torch.autograd.Function):
    """Mish with one transcendental op: tanh(softplus(x)) = n / (n + 2), n = e^x (e^x + 2),
    and its gradient t + x sigmoid(x) (1 - t^2), t = tanh(softplus(x)), by hand (autograd
    through the forward's ops keeps five tensors per call and was barely faster than through
    x * tanh(softplus(x))).

    For x >= 20, t is 1 in float32 and float64 alike; the clamp keeps e^x (and n) finite."""

    @staticmethod
    def forward(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        e = torch.exp(x.clamp(max=20.0))
        n = e.add(2.0).mul_(e)
        t = n.div_(n + 2.0)
        return x * t, t

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:  # the torch.func-compatible form
        ctx.save_for_backward(inputs[0], output[1])
        ctx.mark_non_differentiable(output[1])

    @staticmethod
    def backward(ctx, grad: torch.Tensor, _grad_t: torch.Tensor | None) -> torch.Tensor:
        x, t = ctx.saved_tensors
        return grad * (t + x * torch.sigmoid(x) * (1.0 - t * t))


def mish(x: torch.Tensor) -> torch.Tensor:
    """Mish, x * tanh(softplus(x)), TD-MPC2's activation.

    On a CPU, eager, float32 or float64, from one exp (:class:`_MishFromExp`): tanh and softplus
    are the slow ops there, and torch's own CPU mish kernel is slower still (measured with
    torch 2.13 on one thread). It agrees with F.mish to within 1e-6. Elsewhere ``F.mish``: one
    kernel in eager CUDA, and what a compiled region fuses; on half types too (n overflows
    float16 from x = 5.5)."""
    if x.device.type == "cpu" and x.dtype in (torch.float32, torch.float64) and not torch.compiler.is_compiling():
        return _MishFromExp.apply(x)[0]
    return F.mish(x)


class Mish(nn.Module):
    """:func:`mish` as a module (no parameters: state dicts are those of ``nn.Mish``)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return mish(x)


class SimNorm(nn.Module):
    """Simplicial normalisation: softmax over groups of ``group`` features (default 8).

    Bounds the latent and keeps it sparse-ish, which the paper credits for stable long
    training. (..., d) -> (..., d), each group of 8 sums to 1.
    """

    def __init__(self, group: int = 8):
        super().__init__()
        self.group = group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        return F.softmax(x.unflatten(-1, (shape[-1] // self.group, self.group)), -1).reshape(shape)


class NormedLinear(nn.Module):
    """Linear -> Dropout (if p > 0) -> LayerNorm -> activation (Mish unless given)."""

    def __init__(self, in_dim: int, out_dim: int, dropout: float = 0.0, act: nn.Module | None = None):
        super().__init__()
        self.linear = nn.Linear(in_dim, out_dim)
        self.dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        self.ln = nn.LayerNorm(out_dim)
        self.act = act if act is not None else Mish()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.ln(self.dropout(self.linear(x))))


def mlp(in_dim: int, hidden: int, out_dim: int, last: str = "linear") -> nn.Sequential:
    """in -> h -> h -> out with NormedLinear hidden layers; last is a plain Linear ("linear")
    or NormedLinear + SimNorm ("simnorm", used by encoder and dynamics)."""
    head = OutputLinear(hidden, out_dim) if last == "linear" else NormedLinear(hidden, out_dim, act=SimNorm())
    return nn.Sequential(NormedLinear(in_dim, hidden), NormedLinear(hidden, hidden), head)


class QEnsemble(nn.Module):
    """Q members of (in -> h -> h -> K), evaluated in ONE batched call over members.

    Tensors (stacked over members): ``weight{i}`` (Q, in_i, out_i), ``bias{i}`` (Q, out_i),
    and for the two hidden layers ``ln_weight{i}``, ``ln_bias{i}`` (Q, out_i). Dropout (0.01 in
    TD-MPC2) on the first layer only. ``trainable=False`` registers the same tensors as
    buffers: that is the target copy, invisible to optimizers and to gradient averaging.

    Example:
        >>> qs = QEnsemble(num_q=5, in_dim=12, hidden=32)
        >>> qs(torch.randn(3, 7, 12)).shape          # (Q, H, B, K)
        torch.Size([5, 3, 7, 101])
    """

    def __init__(
        self,
        num_q: int,
        in_dim: int,
        hidden: int,
        out_dim: int = NUM_BINS,
        dropout: float = 0.01,
        trainable: bool = True,
    ):
        super().__init__()
        self.num_q, self.dropout = num_q, dropout
        dims = [in_dim, hidden, hidden, out_dim]
        self.num_layers = len(dims) - 1
        self._names: list[str] = []
        for i, (d_in, d_out) in enumerate(zip(dims[:-1], dims[1:])):
            tensors = {f"weight{i}": torch.empty(num_q, d_in, d_out), f"bias{i}": torch.zeros(num_q, d_out)}
            if i < self.num_layers - 1:
                tensors |= {f"ln_weight{i}": torch.ones(num_q, d_out), f"ln_bias{i}": torch.zeros(num_q, d_out)}
            for name, t in tensors.items():
                if trainable:
                    self.register_parameter(name, nn.Parameter(t))
                else:
                    self.register_buffer(name, t)
                self._names.append(name)

    def tensors(self) -> list[torch.Tensor]:
        """All stacked tensors, in a fixed order (used to copy online -> target)."""
        return [getattr(self, n) for n in self._names]

    def forward(self, x: torch.Tensor, members: torch.Tensor | None = None, detach: bool = False) -> torch.Tensor:
        """x (..., in) -> logits (M, ..., K); M = Q, or len(members) for an index tensor
        ``members``. ``detach=True`` uses detached weights: gradients reach ``x`` only."""
        t = {}
        for n in self._names:
            v = getattr(self, n)
            v = v.detach() if detach else v
            t[n] = v if members is None else v.index_select(0, members)
        lead = x.shape[:-1]
        h = x.reshape(-1, x.shape[-1])  # (N, in)
        for i in range(self.num_layers):
            if i == 0:  # one GEMM for all members: the input is shared
                h = torch.einsum("ni,mio->mno", h, t["weight0"]) + t["bias0"].unsqueeze(1)
            elif i < self.num_layers - 1:  # (M, N, in_i) @ (M, in_i, out_i), batched over members
                h = torch.baddbmm(t[f"bias{i}"].unsqueeze(1), h, t[f"weight{i}"])
            else:  # the logits in fp32 even under bf16 autocast (see OutputLinear)
                with torch.autocast(device_type=h.device.type, enabled=False):
                    h = torch.baddbmm(t[f"bias{i}"].unsqueeze(1).float(), h.float(), t[f"weight{i}"].float())
            if i < self.num_layers - 1:
                if i == 0 and self.dropout > 0:
                    h = F.dropout(h, self.dropout, self.training)
                h = F.layer_norm(h, h.shape[-1:])
                h = mish(h * t[f"ln_weight{i}"].unsqueeze(1) + t[f"ln_bias{i}"].unsqueeze(1))
        return h.reshape(h.shape[0], *lead, h.shape[-1])


class PolicyPrior(nn.Module):
    """Tanh-squashed Gaussian policy d -> h -> h -> 2A (mean, log_std in [-10, 2]).

    ``forward(z)`` is what the policy update differentiates. Returns ``(action, info)``:
    action (..., A) in (-1, 1), and info with ``mean`` (tanh of the mean, the deterministic
    action), ``log_std`` (..., A), ``log_prob`` (..., 1) log density of the squashed action
    summed over dims, ``entropy`` = -log_prob (a one-sample estimate) and ``scaled_entropy``,
    the bonus of the policy loss (TD-MPC2: 1e-4 x the scaled entropy): the
    Gaussian part of -log_prob, itself a sum over the A dims, multiplied by A once more,
    minus the squash's log-det: -(A * log N(u) - log|det d tanh(u)/du|). That is the official
    release's form (its ``gaussian_logprob(..., size)``; today's official code drops the
    log-det term, a difference weighted by 1e-4). Scaling by A keeps the bonus from fading
    against Q in many-dimensional action spaces (38 for dog).
    Noise comes from the global RNG unless ``eps`` is given.

    Example:
        >>> pi = PolicyPrior(latent_dim=16, mlp_dim=32, action_dim=3)
        >>> a, info = pi(torch.randn(5, 16))
        >>> a.shape, info["scaled_entropy"].shape
        (torch.Size([5, 3]), torch.Size([5, 1]))
    """

    def __init__(
        self, latent_dim: int, mlp_dim: int, action_dim: int, log_std_min: float = -10.0, log_std_max: float = 2.0
    ):
        super().__init__()
        self.action_dim = action_dim
        self.log_std_min, self.log_std_max = log_std_min, log_std_max
        self.net = mlp(latent_dim, mlp_dim, 2 * action_dim)

    def forward(self, z: torch.Tensor, eps: torch.Tensor | None = None) -> tuple[torch.Tensor, dict]:
        mean, raw_log_std = self.net(z).chunk(2, dim=-1)  # (..., A) each
        log_std = squash_log_std(raw_log_std, self.log_std_min, self.log_std_max)
        if eps is None:
            eps = torch.randn_like(mean)
        action, mean, log_prob = squashed_gaussian_sample(mean, log_std, eps)
        # log_prob = log N(u) - log-det; the scaled form counts the Gaussian part A times
        scaled_log_prob = log_prob + (self.action_dim - 1) * gaussian_log_prob(eps, log_std)
        info = {
            "mean": mean,
            "log_std": log_std,
            "log_prob": log_prob,
            "entropy": -log_prob,
            "scaled_entropy": -scaled_log_prob,
        }
        return action, info


# --------------------------------------------------------------------------- world model


class WorldModel(nn.Module):
    """TD-MPC2 implicit world model: encoder, latent dynamics, reward, Q ensemble, policy.

    Args: obs_dim, action_dim; model_size in {1, 5, 19, 48, 317}; ``dims`` overrides the
    table (tests, tiny models); ``dropout`` on each Q member's first layer (0.01 in the
    paper; 0 makes an update deterministic given its noise). ``parameters()`` are the online
    networks only (the target Q copy is buffers). See the module docstring for training.

    Example:
        >>> model = WorldModel(obs_dim=24, action_dim=6, model_size=1)
        >>> z = model.encode(torch.randn(8, 24))                     # (B, d)
        >>> model.Q(z, torch.zeros(8, 6), "min").shape               # (B, 1)
        torch.Size([8, 1])
    """

    def __init__(
        self, obs_dim: int, action_dim: int, model_size: int = 5, dims: ModelDims | None = None, dropout: float = 0.01
    ):
        super().__init__()
        self.dims = dims if dims is not None else dims_for_model_size(model_size)
        d, h, e, A = self.dims.latent_dim, self.dims.mlp_dim, self.dims.enc_dim, action_dim
        self.obs_dim, self.action_dim, self.num_q = obs_dim, action_dim, self.dims.num_q
        n_hidden = max(self.dims.num_enc_layers - 1, 1)
        self.encoder = nn.Sequential(
            *[NormedLinear(obs_dim if i == 0 else e, e) for i in range(n_hidden)],
            NormedLinear(e, d, act=SimNorm()),
        )
        self.dynamics = mlp(d + A, h, d, last="simnorm")
        self.reward_head = mlp(d + A, h, NUM_BINS)
        self.qs = QEnsemble(self.num_q, d + A, h, NUM_BINS, dropout=dropout)
        self.target_qs = QEnsemble(self.num_q, d + A, h, NUM_BINS, dropout=dropout, trainable=False)
        self.policy = PolicyPrior(d, h, A)
        self.reset_parameters()

    def train(self, mode: bool = True) -> WorldModel:
        """As ``nn.Module.train``, but the target Qs stay in eval mode: TD targets are made
        without dropout (as in the official code), so they do not depend on dropout masks."""
        super().train(mode)
        self.target_qs.train(False)
        return self

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """TD-MPC2's init: weights ~ truncated normal(std 0.02), biases 0, LayerNorm (1, 0);
        last layer of reward and of every Q zeroed (value/reward predictions start at 0)."""
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.trunc_normal_(m.weight, std=0.02)
                nn.init.zeros_(m.bias)
        for i in range(self.qs.num_layers - 1):
            nn.init.trunc_normal_(getattr(self.qs, f"weight{i}"), std=0.02)
        nn.init.zeros_(getattr(self.qs, f"weight{self.qs.num_layers - 1}"))
        nn.init.zeros_(self.reward_head[-1].weight)
        self.make_target()

    # ---- pieces -----------------------------------------------------------------------
    def encode(self, obs: torch.Tensor) -> torch.Tensor:
        """(..., obs_dim) -> (..., d)."""
        return self.encoder(obs)

    def next(self, z: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
        """Latent dynamics: (..., d), (..., A) -> (..., d)."""
        return self.dynamics(torch.cat([z, a], -1))

    def reward(self, z: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
        """Reward logits (..., K); decode with ``two_hot_inv``."""
        return self.reward_head(torch.cat([z, a], -1))

    def pi(self, z: torch.Tensor) -> tuple[torch.Tensor, dict]:
        """Policy prior sample: see :class:`PolicyPrior`."""
        return self.policy(z)

    def Q(
        self,
        z: torch.Tensor,
        a: torch.Tensor,
        return_type: str = "min",
        target: bool = False,
        detach: bool = False,
        members: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Q ensemble. 'all': logits (Q, ..., K). 'min' / 'avg': scalar (..., 1), min or mean
        of 2 members drawn at random (without replacement, on z's device: no host sync), or of
        the given ``members`` (an index tensor (2,): the training loop draws them from a
        generator shared by all ranks, so all ranks use the same pair, as one big batch would).
        ``target`` uses the target copy; ``detach`` blocks gradients to Q parameters only
        (policy loss). Only the 2 drawn members are computed for 'min' / 'avg'."""
        if return_type not in ("all", "min", "avg"):
            raise ValueError(f"return_type must be 'all', 'min' or 'avg'; got {return_type!r}")
        net = self.target_qs if target else self.qs
        x = torch.cat([z, a], -1)
        if return_type == "all":
            return net(x, detach=detach)
        if members is None and self.num_q > 2:
            members = torch.randperm(self.num_q, device=x.device)[:2]
        # num_q == 2: both members, no draw. (randperm(2)[:2] is a no-op slice that trips an
        # inductor pattern-matcher error under torch.compile in torch 2.13: "slice_shape".)
        q = two_hot_inv(net(x, members=members, detach=detach))  # (2, ..., 1)
        return q.min(0).values if return_type == "min" else q.mean(0)

    # ---- target copy -------------------------------------------------------------------
    @torch.no_grad()
    def make_target(self) -> None:
        """target <- online Q weights. Call after rank 0's weights were broadcast."""
        for t, p in zip(self.target_qs.tensors(), self.qs.tensors()):
            t.copy_(p)

    @torch.no_grad()
    def soft_update_target(self, tau: float) -> None:
        """target <- (1 - tau) target + tau online (TD-MPC2: tau = 0.01)."""
        for t, p in zip(self.target_qs.tensors(), self.qs.tensors()):
            t.lerp_(p, tau)

    # ---- losses' inputs ----------------------------------------------------------------
    @torch.no_grad()
    def td_target(
        self,
        next_z: torch.Tensor,
        reward: torch.Tensor,
        terminated: torch.Tensor | None,
        discount: float | torch.Tensor,
        members: torch.Tensor | None = None,
        eps: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """r + discount * (1 - terminated) * min of 2 random target Qs at (z', pi(z')).
        Shapes (H, B, d), (H, B, 1), (H, B, 1) or None -> (H, B, 1). No gradient.
        Optional ``members`` (2,) fixes the Q pair and ``eps`` (H, B, A) the policy's noise."""
        q = self.Q(next_z, self.policy(next_z, eps)[0], "min", target=True, members=members)
        not_done = 1.0 if terminated is None else 1.0 - terminated.to(q.dtype)
        return reward + discount * not_done * q

    def forward(
        self,
        obs: torch.Tensor,
        action: torch.Tensor,
        reward: torch.Tensor | None = None,
        terminated: torch.Tensor | None = None,
        discount: float | torch.Tensor | None = None,
        members: torch.Tensor | None = None,
        eps: torch.Tensor | None = None,
    ) -> dict[str, torch.Tensor]:
        """Everything the world-model loss needs, in one call (what the learner differentiates).

        Args: obs (H+1, B, obs_dim), action (H, B, A); optional reward / terminated
        (H, B, 1) and discount to also return TD targets (``members``, ``eps``: see
        :meth:`td_target`).
        Returns dict: ``z`` (H+1, B, d) latent rollout from enc(obs[0]) through the dynamics
        (with grad); ``next_z`` (H, B, d) = enc(obs[1:]) without grad (consistency target, no
        target encoder, as in TD-MPC2); ``reward_logits`` (H, B, K) and ``q_logits``
        (Q, H, B, K) at (z[:-1], action); ``td_target`` (H, B, 1) when reward is given.
        """
        with torch.no_grad():
            next_z = self.encode(obs[1:])
        zs = [self.encode(obs[0])]
        for t in range(action.shape[0]):
            zs.append(self.next(zs[-1], action[t]))
        z = torch.stack(zs)  # (H+1, B, d)
        out = {
            "z": z,
            "next_z": next_z,
            "reward_logits": self.reward(z[:-1], action),
            "q_logits": self.Q(z[:-1], action, "all"),
        }
        if reward is not None:
            if discount is None:
                raise ValueError("forward: discount is required with reward")
            out["td_target"] = self.td_target(next_z, reward, terminated, discount, members, eps)
        return out

    def world_model_param_groups(self, lr: float, encoder_lr_scale: float = 0.3) -> list[dict]:
        """Adam param groups for the world-model optimizer (TD-MPC2: encoder lr x 0.3);
        the policy has its own optimizer over ``model.policy.parameters()``."""
        rest = [p for m in (self.dynamics, self.reward_head, self.qs) for p in m.parameters()]
        return [{"params": list(self.encoder.parameters()), "lr": lr * encoder_lr_scale}, {"params": rest, "lr": lr}]
