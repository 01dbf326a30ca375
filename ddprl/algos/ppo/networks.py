"""PPO actor-critic networks: an MLP for vector observations, a CNN for C x H x W planes, the
Nature CNN for Atari frames.

``forward`` computes everything the PPO loss needs in one call: the update step differentiates
one call of the module (``torch.func.functional_call`` when compiled), trunk computed once.
"""

from __future__ import annotations

import copy
import math
from typing import NamedTuple

import gymnasium as gym
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.distributions import Categorical, Normal

from ddprl.algos.layers import OutputLinear


class PolicyOutput(NamedTuple):
    action: torch.Tensor  # (B,) discrete or (B, A) continuous
    log_prob: torch.Tensor  # (B,)
    entropy: torch.Tensor  # (B,)
    value: torch.Tensor  # (B,)


def _layer(layer: nn.Module, std: float = math.sqrt(2), ortho: bool = True) -> nn.Module:
    # Orthogonal init (Engstrom et al. 2020 list it among PPO's code-level choices that matter);
    # ortho=False keeps torch's own init, as SB3's ortho_init=False (the zoo's MuJoCo keys).
    if ortho:
        nn.init.orthogonal_(layer.weight, std)
        nn.init.zeros_(layer.bias)
    return layer


_LOG_SQRT_2PI = math.log(math.sqrt(2 * math.pi))  # the constant of Normal.log_prob, computed as it does

ACTIVATIONS = {"tanh": nn.Tanh, "relu": nn.ReLU}  # the mlp policy's hidden activation (key ``activation``)
_ACTIVATION_OPS = {nn.Tanh: torch.tanh, nn.ReLU: torch.relu}  # what each module's forward calls


def mlp(
    in_dim: int, hidden: list[int], out_dim: int, out_std: float, activation: str = "tanh", ortho: bool = True
) -> nn.Sequential:
    layers: list[nn.Module] = []
    for width in hidden:
        layers += [_layer(nn.Linear(in_dim, width), ortho=ortho), ACTIVATIONS[activation]()]
        in_dim = width
    layers.append(_layer(OutputLinear(in_dim, out_dim), std=out_std, ortho=ortho))
    return nn.Sequential(*layers)


def run_mlp(layers: nn.Sequential, x: torch.Tensor) -> torch.Tensor:
    """``layers(x)`` for an :func:`mlp`, the same ops on the same parameters without a module call
    per layer: at a rollout's batch of one to a few rows the network is bound by Python, and the
    calls (hooks looked up, ``Sequential`` iterating) were about a third of an act (~30 of ~85 us on
    a CPU core for CartPole's two [64, 64] MLPs). Parameters are read from the modules at each call,
    so ``functional_call``, ``load_state_dict`` and optimizers see through it."""
    for layer in layers._modules.values():
        op = _ACTIVATION_OPS.get(type(layer))
        if op is not None:
            x = op(x)
        elif type(layer) is nn.Linear:
            x = F.linear(x, layer.weight, layer.bias)
        elif type(layer) is OutputLinear and not torch.is_autocast_enabled(x.device.type):
            x = F.linear(x.float(), layer.weight, layer.bias)  # OutputLinear.forward outside autocast
        else:  # OutputLinear under autocast (it switches autocast off) and any other module: its own call
            x = layer(x)
    return x


class ConvTrunk(nn.Module):
    """``depth`` 3x3 conv layers of ``width`` channels (same padding, so small boards keep every
    cell), then flatten and the dense layers ``hidden`` (ReLU)."""

    def __init__(self, obs_shape: tuple[int, ...], width: int, depth: int, hidden: list[int], ortho: bool = True):
        super().__init__()
        c, h, w = obs_shape
        convs: list[nn.Module] = []
        for _ in range(depth):
            convs += [_layer(nn.Conv2d(c, width, 3, padding=1), ortho=ortho), nn.ReLU()]
            c = width
        self.convs = nn.Sequential(*convs)
        dense: list[nn.Module] = [nn.Flatten()]
        in_dim = width * h * w
        for units in hidden:
            dense += [_layer(nn.Linear(in_dim, units), ortho=ortho), nn.ReLU()]
            in_dim = units
        self.head = nn.Sequential(*dense)
        self.out_dim = in_dim

    def forward(self, obs: torch.Tensor) -> torch.Tensor:  # (B, C, H, W) -> (B, out_dim)
        return self.head(self.convs(obs))


class NatureCNN(nn.Module):
    """The DQN network's trunk (Mnih et al. 2015), as the PPO paper and CleanRL run it on Atari:
    pixels in [0, 255] scaled to [0, 1], conv 32 8x8 stride 4, conv 64 4x4 stride 2, conv 64
    3x3 stride 1, dense 512, ReLU after each; orthogonal init with gain sqrt 2, zero biases.

    >>> NatureCNN((4, 84, 84))(torch.zeros(2, 4, 84, 84)).shape
    torch.Size([2, 512])
    """

    MIN_SIZE = 36  # the smallest height and width the three convs leave a pixel of

    def __init__(self, obs_shape: tuple[int, ...], ortho: bool = True):
        super().__init__()
        c, h, w = obs_shape
        if min(h, w) < self.MIN_SIZE:
            raise ValueError(f"the Nature CNN needs frames of at least {self.MIN_SIZE}x{self.MIN_SIZE}, got {h}x{w}")
        self.convs = nn.Sequential(
            _layer(nn.Conv2d(c, 32, 8, stride=4), ortho=ortho),
            nn.ReLU(),
            _layer(nn.Conv2d(32, 64, 4, stride=2), ortho=ortho),
            nn.ReLU(),
            _layer(nn.Conv2d(64, 64, 3, stride=1), ortho=ortho),
            nn.ReLU(),
            nn.Flatten(),
        )
        flat = 64 * self._side(h) * self._side(w)  # 64 x 7 x 7 for 84 x 84 frames
        self.head = nn.Sequential(_layer(nn.Linear(flat, 512), ortho=ortho), nn.ReLU())
        self.out_dim = 512

    @staticmethod
    def _side(n: int) -> int:
        for kernel, stride in ((8, 4), (4, 2), (3, 1)):
            n = (n - kernel) // stride + 1
        return n

    @staticmethod
    def channels_last(device: torch.device) -> bool:
        """Whether the convolutions take channels-last frames on ``device``."""
        return device.type == "cpu"

    def forward(self, obs: torch.Tensor) -> torch.Tensor:  # (B, C, H, W) in [0, 255] -> (B, 512)
        if self.channels_last(obs.device):
            # oneDNN's CPU convolutions are faster on channels-last frames (the Atari preset's update
            # on one core: about a sixth less time); CUDA keeps the layout it is given (not measured).
            obs = obs.contiguous(memory_format=torch.channels_last)
        return self.head(self.convs(obs / 255.0))


class ActorCritic(nn.Module):
    """Policy and value function for a Discrete or Box action space.

    >>> net = ActorCritic(gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(2), hidden_sizes=[64, 64])
    >>> out = net(torch.zeros(3, 4))
    >>> out.action.shape, out.value.shape
    (torch.Size([3]), torch.Size([3]))
    """

    def __init__(
        self,
        obs_space: gym.Space,
        action_space: gym.Space,
        policy: str = "mlp",
        hidden_sizes: list[int] = (64, 64),
        policy_width: int = 32,
        policy_depth: int = 2,
        activation: str = "tanh",
        log_std_init: float = 0.0,
        ortho_init: bool = True,
    ):
        super().__init__()
        obs_shape = tuple(obs_space.shape)
        self.discrete = isinstance(action_space, gym.spaces.Discrete)
        n_out = int(action_space.n) if self.discrete else int(np.prod(action_space.shape))
        self.noise_shape = (n_out,)  # per sample, for act_with_noise
        if policy in ("cnn", "nature_cnn"):
            if len(obs_shape) != 3:
                raise ValueError(f"policy={policy} needs C x H x W observations, got shape {obs_shape}")
            # A shared conv trunk: the expensive part is computed once for actor and critic.
            self.trunk: nn.Module = (
                NatureCNN(obs_shape, ortho_init)
                if policy == "nature_cnn"
                else ConvTrunk(obs_shape, policy_width, policy_depth, list(hidden_sizes), ortho_init)
            )
            feat = self.trunk.out_dim
            self.actor = _layer(OutputLinear(feat, n_out), std=0.01, ortho=ortho_init)
            self.critic = _layer(OutputLinear(feat, 1), std=1.0, ortho=ortho_init)
        else:
            in_dim = int(np.prod(obs_shape))
            self.trunk = nn.Flatten()
            # Separate actor and critic MLPs: the usual choice for low-dimensional control.
            self.actor = mlp(in_dim, list(hidden_sizes), n_out, 0.01, activation, ortho_init)
            self.critic = mlp(in_dim, list(hidden_sizes), 1, 1.0, activation, ortho_init)
        self.is_mlp = type(self.trunk) is nn.Flatten  # separate actor and critic MLPs on the flat observation
        if not self.discrete:  # a state-independent log std, log_std_init at the start
            self.log_std = nn.Parameter(torch.full((n_out,), float(log_std_init)))

    def frames_channels_last(self, device: torch.device) -> bool:
        """Whether this policy's convolutions take frames channels-last on ``device`` (so that a
        rollout stores them so)."""
        return isinstance(self.trunk, NatureCNN) and self.trunk.channels_last(device)

    def _trunk(self, obs: torch.Tensor) -> torch.Tensor:
        return obs.flatten(1) if type(self.trunk) is nn.Flatten else self.trunk(obs)  # nn.Flatten's op, no call

    def _actor(self, features: torch.Tensor) -> torch.Tensor:
        return run_mlp(self.actor, features) if isinstance(self.actor, nn.Sequential) else self.actor(features)

    def _critic(self, features: torch.Tensor) -> torch.Tensor:
        return run_mlp(self.critic, features) if isinstance(self.critic, nn.Sequential) else self.critic(features)

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        """V(obs), shape (B,)."""
        return self._critic(self._trunk(obs)).squeeze(-1)

    def distribution(self, features: torch.Tensor):
        logits_or_mean = self._actor(features).float()  # distributions in fp32 even under autocast
        # validate_args=False: argument checks cost more than the tiny networks themselves.
        if self.discrete:
            return Categorical(logits=logits_or_mean, validate_args=False)
        return Normal(logits_or_mean, self.log_std.exp().expand_as(logits_or_mean), validate_args=False)

    def act(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Rollout step: sampled action, its log-prob and V(obs) — no entropy, no gradient needed."""
        features = self._trunk(obs)
        dist = self.distribution(features)
        action = dist.sample()
        log_prob = dist.log_prob(action)
        if not self.discrete:
            log_prob = log_prob.sum(-1)
        return action, log_prob, self._critic(features).squeeze(-1).float()

    def act_with_noise(self, obs: torch.Tensor, noise: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``act`` with its random draw given, so that a compiled rollout takes it as an input.

        ``noise`` (B, *noise_shape): for a discrete policy Exp(1) draws ``e``, and the action is
        argmax(logits - log e), a sample of Categorical(logits) (the Gumbel-max trick: -log e is
        Gumbel distributed); for a continuous one standard normal draws, action = mean + std * noise.
        """
        # The arithmetic of :meth:`distribution`'s Categorical / Normal and their log_prob, op for
        # op (the same bits: tests), without building the distribution: ~25 us of Python a step.
        features = self._trunk(obs)
        logits_or_mean = self._actor(features).float()
        if self.discrete:
            log_pmf = logits_or_mean - logits_or_mean.logsumexp(dim=-1, keepdim=True)  # Categorical.logits
            action = (log_pmf - noise.log()).argmax(-1)
            log_prob = log_pmf.gather(-1, action.unsqueeze(-1)).squeeze(-1)
        else:
            mean, std = logits_or_mean, self.log_std.exp().expand_as(logits_or_mean)
            action = mean + std * noise
            log_prob = (-((action - mean) ** 2) / (2 * std**2) - std.log() - _LOG_SQRT_2PI).sum(-1)
        return action, log_prob, self._critic(features).squeeze(-1).float()

    def joint_act(self) -> JointMLPAct:
        """:meth:`act_with_noise` as one network (:class:`JointMLPAct`), for an MLP policy
        (``self.is_mlp``; a conv trunk's acting is bound by its convolutions, not by op count)."""
        return JointMLPAct(self)

    def fill_noise_(self, noise: torch.Tensor) -> torch.Tensor:
        """Fill ``noise`` (..., *noise_shape) in place from the global generator with the draws
        :meth:`act_with_noise` expects."""
        return noise.exponential_() if self.discrete else noise.normal_()

    def eval_action(
        self, obs: torch.Tensor, deterministic: bool = True, generator: torch.Generator | None = None
    ) -> torch.Tensor:
        """Action for evaluation: the most likely one, or one sampled with ``generator``.

        Sampling takes its own generator so that evaluating during training never draws from
        the training RNG (a resumed run must see the same random numbers as the original).
        """
        dist = self.distribution(self._trunk(obs))
        if deterministic:
            return dist.probs.argmax(-1) if self.discrete else dist.mean
        if self.discrete:
            return torch.multinomial(dist.probs, 1, generator=generator).squeeze(-1)
        noise = torch.randn(dist.mean.shape, generator=generator, device=dist.mean.device)
        return dist.mean + dist.stddev * noise

    def forward(self, obs: torch.Tensor, action: torch.Tensor | None = None) -> PolicyOutput:
        """Sample (or score a given ``action``) and evaluate the value, in one pass."""
        features = self._trunk(obs)
        dist = self.distribution(features)
        if action is None:
            action = dist.sample()
        log_prob = dist.log_prob(action)
        entropy = dist.entropy()
        if not self.discrete:  # independent action dims: sum over the last axis
            log_prob, entropy = log_prob.sum(-1), entropy.sum(-1)
        value = self._critic(features).squeeze(-1).float()
        return PolicyOutput(action, log_prob, entropy, value)


class CastTrunk:
    """A copy of ``policy`` to act with under ``dtype`` autocast, its trunk's weights already in
    ``dtype``: autocast casts an fp32 weight at every call (the Nature CNN's 1.7M: ~0.35 ms of an
    act's 1.2 ms on 4 frames on a CPU core), and takes one of its own dtype as it is, so the copy
    acts bit for bit as ``policy`` under that autocast. :meth:`refresh` copies the weights over
    (a rollout calls it as it starts: the update changes them).

    >>> net = ActorCritic(gym.spaces.Box(0, 255, (4, 84, 84)), gym.spaces.Discrete(4), policy="nature_cnn")
    >>> acting = CastTrunk(net, torch.bfloat16); acting.refresh()
    >>> acting.policy.trunk.head[0].weight.dtype
    torch.bfloat16
    """

    def __init__(self, policy: ActorCritic, dtype: torch.dtype):
        self.source = policy
        self.policy = copy.deepcopy(policy).requires_grad_(False)
        self.policy.trunk.to(dtype)

    @torch.no_grad()
    def refresh(self) -> None:
        for mine, theirs in zip(self.policy.parameters(), self.source.parameters(), strict=True):
            mine.copy_(theirs)  # the trunk's rounded to its dtype as autocast rounds them


class JointMLPAct:
    """:meth:`ActorCritic.act_with_noise` of an MLP policy with the actor and the critic run as one
    network: their first layers stacked, the later ones block-diagonal (zeros between the two), so
    an act is three matrix products and one log-softmax instead of six products and a logsumexp.
    On a CPU core at a rollout's batch of one to a few rows the networks are bound by the number
    of ops, not by FLOPs: CartPole's act takes 40 % of the time (50 against 126 us in a rollout).

    Built from the parameters as they are (detached copies): valid until they change, so a
    rollout builds one as it starts. The same draws give the same actions; log-probs and values
    equal ``act_with_noise``'s to float rounding (the products sum in another order; a test).

    >>> net = ActorCritic(gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(2), hidden_sizes=[8])
    >>> act = net.joint_act()
    >>> [x.shape for x in act(torch.zeros(3, 4), net.fill_noise_(torch.empty(3, 2)))]
    [torch.Size([3]), torch.Size([3]), torch.Size([3])]
    """

    def __init__(self, policy: ActorCritic):
        pairs = list(zip(policy.actor._modules.values(), policy.critic._modules.values(), strict=True))
        linears = [(a, c) for a, c in pairs if isinstance(a, nn.Linear)]
        activations = {type(a) for a, _ in pairs if not isinstance(a, nn.Linear)}
        assert len(activations) <= 1 and all(type(a) is type(c) for a, c in pairs), "mlp()'s actor and critic"
        # an activation after every hidden layer (none without hidden layers)
        self.activation = _IN_PLACE[activations.pop()] if activations else None
        with torch.no_grad():
            # (bias, weight^T) of each layer: the arguments of addmm(bias, x, weight^T), which is what F.linear runs
            self.linears = [
                (
                    torch.cat([a.bias, c.bias]).float(),
                    (torch.cat([a.weight, c.weight]) if depth == 0 else torch.block_diag(a.weight, c.weight))
                    .float()
                    .t(),
                )
                for depth, (a, c) in enumerate(linears)
            ]
            *self.hidden, self.output = self.linears  # the hidden layers' and the output layer's (bias, weight^T)
            self.n_out = linears[-1][0].out_features  # the actor's outputs; the critic's value follows
            self.discrete = policy.discrete
            if not self.discrete:
                self.std = policy.log_std.exp()
                # Normal's log-density at mean + std * noise: -noise^2 / 2 - log std - log sqrt(2 pi), summed
                self.log_density_shift = float((-policy.log_std - _LOG_SQRT_2PI).sum())

    def __call__(self, obs: torch.Tensor, noise: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        flat = obs.dim() == 2 and obs.dtype == torch.float32  # as it comes: no op where none is needed
        x = obs if flat else obs.flatten(1).float()
        for bias, weight in self.hidden:
            x = self.activation(torch.addmm(bias, x, weight))
        bias, weight = self.output
        x = torch.addmm(bias, x, weight)
        out, value = x[:, : self.n_out], x[:, self.n_out]
        if self.discrete:
            log_pmf = torch.log_softmax(out, -1)
            action = (log_pmf - noise.log()).argmax(-1)  # Gumbel-max, as act_with_noise
            return action, log_pmf.gather(-1, action.unsqueeze(-1)).squeeze(-1), value
        action = out + self.std * noise
        return action, noise.square().sum(-1).mul_(-0.5).add_(self.log_density_shift), value


_IN_PLACE = {nn.Tanh: torch.Tensor.tanh_, nn.ReLU: torch.Tensor.relu_}  # the hidden activations, in place (no autograd)
