"""PPO's actor-critic in plain JAX: the torch engine's MLP policy, as a pytree of arrays.

Separate actor and critic MLPs (tanh or relu hidden layers: key ``activation``) with orthogonal
init (gain sqrt(2); 0.01 for the policy head, 1.0 for the value head), zero biases, a
state-independent log-std for continuous actions starting at ``log_std_init`` — the same
network as ``ddprl.algos.ppo.networks.ActorCritic(policy="mlp")``. ``ortho_init=False``
draws weights and biases as torch's ``nn.Linear`` does, uniform in +-1/sqrt(fan_in).
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp

Params = dict[str, Any]
LOG_2PI = math.log(2 * math.pi)


def _mlp_init(key: jax.Array, sizes: list[int], out_gain: float, ortho: bool) -> list[dict[str, jax.Array]]:
    layers = []
    keys = jax.random.split(key, len(sizes) - 1)
    for i, (n_in, n_out) in enumerate(zip(sizes[:-1], sizes[1:], strict=True)):
        if ortho:
            gain = out_gain if i == len(sizes) - 2 else math.sqrt(2)
            w = jax.nn.initializers.orthogonal(gain)(keys[i], (n_in, n_out), jnp.float32)
            b = jnp.zeros((n_out,), jnp.float32)
        else:  # torch's nn.Linear init: kaiming_uniform(a=sqrt 5) is uniform in +-1/sqrt(fan_in), as is the bias
            k_w, k_b = jax.random.split(keys[i])
            bound = 1.0 / math.sqrt(n_in)
            w = jax.random.uniform(k_w, (n_in, n_out), jnp.float32, -bound, bound)
            b = jax.random.uniform(k_b, (n_out,), jnp.float32, -bound, bound)
        layers.append({"w": w, "b": b})
    return layers


ACTIVATIONS = {"tanh": jnp.tanh, "relu": jax.nn.relu}


def _mlp(layers: list[dict[str, jax.Array]], x: jax.Array, activation: str) -> jax.Array:
    act = ACTIVATIONS[activation]
    for layer in layers[:-1]:
        x = act(x @ layer["w"] + layer["b"])
    return x @ layers[-1]["w"] + layers[-1]["b"]


def init_params(
    key: jax.Array,
    obs_dim: int,
    action_dim: int,
    hidden: list[int],
    discrete: bool,
    log_std_init: float = 0.0,
    ortho_init: bool = True,
) -> Params:
    k_actor, k_critic = jax.random.split(key)
    params: Params = {
        "actor": _mlp_init(k_actor, [obs_dim, *hidden, action_dim], 0.01, ortho_init),
        "critic": _mlp_init(k_critic, [obs_dim, *hidden, 1], 1.0, ortho_init),
    }
    if not discrete:
        params["log_std"] = jnp.full((action_dim,), log_std_init, jnp.float32)
    return params


def value(params: Params, obs: jax.Array, activation: str = "tanh") -> jax.Array:
    """V(obs) for a batch (B, ...) → (B,)."""
    return _mlp(params["critic"], obs.reshape(obs.shape[0], -1), activation)[:, 0]


def policy_head(params: Params, obs: jax.Array, activation: str = "tanh") -> jax.Array:
    """Logits (discrete) or the Gaussian mean (continuous), (B, A)."""
    return _mlp(params["actor"], obs.reshape(obs.shape[0], -1), activation)


def sample(key: jax.Array, params: Params, head: jax.Array, discrete: bool) -> jax.Array:
    if discrete:
        return jax.random.categorical(key, head, axis=-1)
    return head + jnp.exp(params["log_std"]) * jax.random.normal(key, head.shape)


def log_prob_entropy(params: Params, head: jax.Array, action: jax.Array, discrete: bool) -> tuple[jax.Array, jax.Array]:
    """log pi(action) and the entropy of pi, both (B,) (independent action dims summed)."""
    if discrete:
        logp_all = jax.nn.log_softmax(head, axis=-1)
        logp = jnp.take_along_axis(logp_all, action[:, None].astype(jnp.int32), axis=-1)[:, 0]
        entropy = -(jnp.exp(logp_all) * logp_all).sum(-1)
        return logp, entropy
    log_std = params["log_std"]
    z = (action - head) / jnp.exp(log_std)
    logp = (-0.5 * z**2 - log_std - 0.5 * LOG_2PI).sum(-1)
    entropy = jnp.broadcast_to(0.5 + 0.5 * LOG_2PI + log_std, head.shape).sum(-1)
    return logp, entropy


def mode(head: jax.Array, discrete: bool) -> jax.Array:
    """The most likely action (evaluation)."""
    return jnp.argmax(head, axis=-1) if discrete else head
