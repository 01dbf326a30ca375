"""PPO's rollout: the storage, the step that fills it (:class:`RolloutStep`) and GAE, all
tensors on the rank's device.

``terminated`` and ``truncated`` are stored apart: a truncated step bootstraps from
V(final_obs), a terminated one does not; both end the GAE chain (docs/ppo.md).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
import torch

from ddprl.algos.graphs import compile_region, mark_static, step_begin
from ddprl.algos.ppo.networks import ActorCritic, CastTrunk


class Rollout(NamedTuple):
    """T steps of N local envs. Shapes: (T, N, ...)."""

    obs: torch.Tensor  # (T, N, *obs_shape) — raw (uint8 pixels stay bytes): normalised at update time
    actions: torch.Tensor  # (T, N) or (T, N, A)
    log_probs: torch.Tensor  # (T, N)
    values: torch.Tensor  # (T, N)  V(obs_t)
    rewards: torch.Tensor  # (T, N)
    terminated: torch.Tensor  # (T, N) bool
    truncated: torch.Tensor  # (T, N) bool
    final_values: torch.Tensor  # (T, N)  V(final_obs_t), used where truncated


def obs_storage_dtype(space: Any) -> torch.dtype:
    """How a rollout stores observations of ``space``: bytes where the space says so (pixels:
    Atari's 4x84x84 frames, a quarter of float32's memory, and exact: they are integers), else
    float32. The policy still sees float32 (the env's tensors, and the update's minibatches)."""
    return torch.uint8 if np.dtype(space.dtype) == np.uint8 else torch.float32


class RolloutBuffer:
    """Preallocated storage for one rollout of ``n_steps`` x ``num_envs`` on ``device``.

    ``obs_channels_last``: C x H x W frames kept in H x W x C memory order (``data.obs`` is a
    permuted view, indexed as ever): a minibatch's frames are then gathered whole into the
    channels-last layout the CPU convolutions take, where gathering from C x H x W memory
    transposes element by element (the Atari update on a core: 49 -> 42 ms an optimizer step).
    """

    def __init__(
        self,
        n_steps: int,
        num_envs: int,
        obs_shape: tuple,
        action_shape: tuple,
        action_dtype: torch.dtype,
        device: torch.device,
        obs_dtype: torch.dtype = torch.float32,
        obs_channels_last: bool = False,
    ):
        def z(*shape, dtype=torch.float32):
            return torch.zeros((n_steps, num_envs, *shape), dtype=dtype, device=device)

        if obs_channels_last:
            if len(obs_shape) != 3:
                raise ValueError(f"channels-last storage is for C x H x W frames, not observations of {obs_shape}")
            c, h, w = obs_shape
            obs = z(h, w, c, dtype=obs_dtype).permute(0, 1, 4, 2, 3)
        else:
            obs = z(*obs_shape, dtype=obs_dtype)
        self.data = Rollout(
            obs=obs,
            actions=z(*action_shape, dtype=action_dtype),
            log_probs=z(),
            values=z(),
            rewards=z(),
            terminated=z(dtype=torch.bool),
            truncated=z(dtype=torch.bool),
            final_values=z(),
        )
        self.n_steps = n_steps

    def store(self, t: int | torch.Tensor, **step: torch.Tensor) -> None:
        for name, value in step.items():
            getattr(self.data, name)[t] = value


def casts_to_bf16(autocast: contextlib.AbstractContextManager) -> bool:
    """Whether ``autocast`` (``ddprl.algos.common.autocast_context``'s) runs bf16 autocast."""
    return isinstance(autocast, torch.autocast) and autocast.fast_dtype == torch.bfloat16


def acts_jointly(env: Any, policy: ActorCritic, autocast: contextlib.AbstractContextManager) -> bool:
    """Whether a rollout of ``env`` acts through :class:`~ddprl.algos.ppo.networks.JointMLPAct`: an
    MLP policy in fp32 on a host env of a CPU rank, where acting is bound by the count of small ops.
    Eager, it is cheaper than the compiled act there too (CartPole, SB3's keys, a core: 73 against
    113 us a step, the loop's own work included), so ``compile`` leaves it eager."""
    on_host = not getattr(env, "traceable_step", False) and env.device.type == "cpu"
    return on_host and policy.is_mlp and isinstance(autocast, contextlib.nullcontext)


class RolloutStep:
    """``unroll`` env steps of the policy into ``buffer`` per call: act, env step, V(final_obs),
    store, episode sums. One function, run eagerly or compiled (``compile=True``).

    An env whose step traces (``env.traceable_step``: Snake) steps inside the function
    (``env.advance`` on random integers drawn before each call): compiled, the ``unroll`` steps
    are ONE graph (``ddprl.algos.graphs``; a CUDA graph on one GPU). Any other env (Gymnasium,
    DMC) steps on the host, and compiling covers the policy alone; on a CPU rank an MLP policy in
    fp32 acts eagerly through :class:`~ddprl.algos.ppo.networks.JointMLPAct` (:func:`acts_jointly`).
    The policy's random draw is an input either way (``act_with_noise`` on noise filled from the
    global generator before each call), so an eager and a compiled run act alike.

    Writes rows ``0..n_steps-1`` through a device cursor; :meth:`collect` returns the episode
    sums the loop logs.

    >>> rollout = RolloutStep(env, policy, buffer, lambda x: x, nullcontext(), unroll=8)  # doctest: +SKIP
    >>> ep_return_sum, ep_count = rollout.collect()      # buffer.n_steps env steps, 0-d tensors
    """

    def __init__(
        self,
        env: Any,
        policy: ActorCritic,
        buffer: RolloutBuffer,
        normalize: Callable,
        autocast: contextlib.AbstractContextManager,
        unroll: int = 1,
        compile: bool = False,
        obs: torch.Tensor | None = None,
    ):
        if buffer.n_steps % unroll:
            raise ValueError(f"unroll={unroll} must divide n_steps={buffer.n_steps}")
        device = env.device
        self.env, self.policy, self.buffer, self.normalize, self.autocast = env, policy, buffer, normalize, autocast
        self.unroll, self.device = unroll, device
        self.in_graph = bool(getattr(env, "traceable_step", False))
        # A host env on a CPU rank: reading a tensor waits for nothing, so :meth:`collect` runs
        # :meth:`host_steps`, which skips each step's work when no episode ended.
        self.on_host = not self.in_graph and device.type == "cpu"
        self.obs = obs  # a host env's current observation; a traceable env observes its state
        self.env_s = 0.0  # seconds in a host env's own steps so far (the run's time split)
        self.cursor = torch.zeros(1, dtype=torch.long, device=device)  # buffer row of the next step
        self.action_noise = torch.empty(unroll, env.num_envs, *policy.noise_shape, device=device)
        self.env_noise = (
            torch.empty(unroll, *env.draw_shape, dtype=torch.long, device=device) if self.in_graph else None
        )
        # bf16 on a host rollout of a CPU rank: act through a copy whose trunk is bf16 already
        self.cast = (
            CastTrunk(policy, torch.bfloat16)
            if self.on_host and casts_to_bf16(autocast) and next(policy.trunk.parameters(), None) is not None
            else None
        )
        acting = policy if self.cast is None else self.cast.policy
        self.act = acting.act_with_noise
        self.region: Callable = self.steps
        if self.in_graph:
            # fixed addresses: a CUDA graph reads and writes these in place (mark_static)
            mark_static(
                self.cursor,
                self.action_noise,
                self.env_noise,
                *buffer.data,
                *(t for t in vars(env).values() if isinstance(t, torch.Tensor)),
            )
            if compile:
                self.region = compile_region(self.steps, device, name="ppo rollout")
        # the joint act's builder: it is rebuilt from the parameters at each rollout (the update changes them)
        self.joint = policy.joint_act if acts_jointly(env, policy, autocast) else None
        if compile and not self.in_graph and self.joint is None:
            self.act = torch.compile(acting.act_with_noise)

    def observe(self) -> torch.Tensor:
        """The observation the next step acts on."""
        return self.env.observe() if self.in_graph else self.obs

    def steps(self, action_noise: torch.Tensor, env_noise: torch.Tensor | None) -> torch.Tensor:
        """``unroll`` steps from the env's current state, stored at the cursor.

        ``action_noise`` (K, N, *noise_shape), ``env_noise`` (K, *draw_shape) or None (a host
        env draws its own). Returns (2,): the summed returns of the episodes that ended, and
        their count.
        """
        obs = self.observe()
        finished = torch.zeros(2, device=self.device)
        for j in range(self.unroll):  # unrolled: K copies of the step in one graph
            with self.autocast:
                action, log_prob, value = self.act(self.normalize(obs), action_noise[j])
            if self.in_graph:
                next_obs, reward, terminated, truncated, info = self.env.advance(action, env_noise[j])
            else:
                start = time.perf_counter()
                next_obs, reward, terminated, truncated, info = self.env.step(action)
                self.env_s += time.perf_counter() - start
            # V(final_obs) bootstraps truncated episodes. Asking whether any was truncated is a
            # host read: only a host env on the CPU asks, to skip the forward.
            if self.in_graph or self.device.type != "cpu" or bool(truncated.any()):
                with self.autocast:
                    final_values = self.policy.value(self.normalize(info["final_obs"])).float()
            else:
                final_values = torch.zeros_like(value)
            self.buffer.store(
                self.cursor + j,
                obs=obs,
                actions=action,
                log_probs=log_prob,
                values=value,
                rewards=reward,
                terminated=terminated,
                truncated=truncated,
                final_values=final_values,
            )
            done = terminated | truncated
            scored = info.get("episode_end", done)  # the episodes scored (Atari: games, not lives)
            finished = finished + torch.stack([(info["episode_return"] * scored).sum(), scored.sum().float()])
            obs = next_obs
        if not self.in_graph:
            self.obs = obs
        self.cursor.add_(self.unroll)
        return finished

    @torch.no_grad()
    def collect(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``buffer.n_steps`` steps of every env: n_steps / unroll calls. Returns the summed
        returns of the episodes that ended and their count (0-d device tensors)."""
        self.cursor.zero_()
        if self.cast is not None:
            self.cast.refresh()
        if getattr(self.env, "parts", 1) > 1 and not self.in_graph:
            return self.overlapped_steps()
        if self.on_host:
            return self.host_steps()
        finished = torch.zeros(2, device=self.device)
        for _ in range(self.buffer.n_steps // self.unroll):
            self.policy.fill_noise_(self.action_noise)
            if self.env_noise is not None:
                self.env.draw_into(self.env_noise)
            step_begin(self.device)
            finished += self.region(self.action_noise, self.env_noise)  # read before the next replay reuses it
        return finished[0], finished[1]

    def host_steps(self) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`collect` for a host env on a CPU rank: the draws, the stored rows and the episode
        sums of :meth:`steps` (a test compares them), at less Python and fewer tiny tensors a step;
        acting jointly (:func:`acts_jointly`), log-probs and values to float rounding.

        A CPU rollout of a few envs is bound by the cost of each small tensor op, not by the env
        count. Reading a tensor costs nothing on the CPU, so the episode sums and V(final_obs) are
        computed only on the steps where an episode ended (adding the others' zeros changes no
        bit); rows are Python integers (a tensor index is an indexed copy), and each step's small
        tensors are kept and stacked into the buffer once at the end (the env hands over tensors
        it does not write again: ``ddprl.envs.base``).
        """
        data, obs, row = self.buffer.data, self.obs, 0
        data.final_values.zero_()  # V(final_obs) stays 0 on the rows with no truncation, as steps() stores here
        finished = torch.zeros(2, device=self.device)
        act = self.act if self.joint is None else self.joint()
        kept: list[tuple[torch.Tensor, ...]] = []  # each step's small tensors, stacked into the buffer at the end
        for _ in range(self.buffer.n_steps // self.unroll):
            self.policy.fill_noise_(self.action_noise)
            call = None  # this call's episode sums, added up per call as steps() does
            for j in range(self.unroll):
                with self.autocast:
                    action, log_prob, value = act(self.normalize(obs), self.action_noise[j])
                start = time.perf_counter()
                next_obs, reward, terminated, truncated, info = self.env.step(action)
                self.env_s += time.perf_counter() - start
                data.obs[row] = obs
                kept.append((action, log_prob, value, reward, terminated, truncated))
                done = terminated | truncated
                if done.any():
                    if truncated.any():
                        with self.autocast:
                            data.final_values[row] = self.policy.value(self.normalize(info["final_obs"])).float()
                    scored = info.get("episode_end", done)  # within done
                    ended = torch.stack([(info["episode_return"] * scored).sum(), scored.sum().float()])
                    call = ended if call is None else call + ended
                obs, row = next_obs, row + 1
            if call is not None:
                finished += call
        fields = (data.actions, data.log_probs, data.values, data.rewards, data.terminated, data.truncated)
        for field, column in zip(fields, zip(*kept, strict=True), strict=True):
            torch.stack(column, out=field)
        self.obs = obs
        self.cursor.fill_(row)
        return finished[0], finished[1]

    def overlapped_steps(self) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`collect` for an env stepped in parts (``env.parts``: EnvPool's Atari games with
        ``env_overlap``): the policy acts on one part while the other steps in EnvPool's threads.

        Each env sees what :meth:`host_steps` gives it: the same noise, observations, actions and
        rewards; log-probs and values differ by float rounding (the policy's sums over half
        batches; a test compares the two rollouts). Every part is received before the rollout
        returns: no env steps during the update.
        """
        data, env, parts = self.buffer.data, self.env, self.env.part_slices
        obs = [self.obs[rows] for rows in parts]  # each part's current observation
        data.final_values.zero_()  # stays 0 on rows with no truncation, as the other paths store
        finished = torch.zeros(2, device=self.device)
        in_flight: list[tuple[int, int]] = []  # (part, row) sent and not received, oldest first
        for row in range(self.buffer.n_steps):
            j = row % self.unroll
            if j == 0:
                self.policy.fill_noise_(self.action_noise)  # drawn where the other paths draw it
            for part, rows in enumerate(parts):
                with self.autocast:
                    action, log_prob, value = self.act(self.normalize(obs[part]), self.action_noise[j, rows])
                start = time.perf_counter()
                env.send(action, part)
                self.env_s += time.perf_counter() - start
                for field, x in zip(data, (obs[part], action, log_prob, value)):
                    field[row, rows] = x
                in_flight.append((part, row))
                if len(in_flight) == len(parts):  # every part stepping: take the oldest back
                    self.receive(*in_flight.pop(0), obs, finished)
        while in_flight:
            self.receive(*in_flight.pop(0), obs, finished)
        self.obs = torch.cat(obs)
        self.cursor.fill_(self.buffer.n_steps)
        return finished[0], finished[1]

    def receive(self, part: int, row: int, obs: list[torch.Tensor], finished: torch.Tensor) -> None:
        """Part ``part``'s step of row ``row`` from the env: stored, its next observation put in
        ``obs``, the summed returns of the episodes that ended and their count added to
        ``finished`` (2,). Nothing is added where none ended (adding zeros changes no bit)."""
        data, rows = self.buffer.data, self.env.part_slices[part]
        start = time.perf_counter()
        obs[part], reward, terminated, truncated, info = self.env.recv(part)
        self.env_s += time.perf_counter() - start  # the wait for the part: what overlapping did not hide
        data.rewards[row, rows], data.terminated[row, rows], data.truncated[row, rows] = reward, terminated, truncated
        done = terminated | truncated
        if not done.any():
            return
        if truncated.any():
            with self.autocast:
                data.final_values[row, rows] = self.policy.value(self.normalize(info["final_obs"])).float()
        scored = info.get("episode_end", done)  # within done
        finished += torch.stack([(info["episode_return"] * scored).sum(), scored.sum().float()])


def compute_gae(
    rollout: Rollout, next_values: torch.Tensor, gamma: float, gae_lambda: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation (Schulman et al. 2016), truncation-aware.

    ``next_values`` (N,) is V of the observation after the last step. Returns
    ``(advantages, returns)``, both (T, N), with returns = advantages + values.

    For step t:  bootstrap = V(final_obs_t) if truncated_t else V(obs_{t+1});
                 delta_t   = r_t + gamma * bootstrap * (1 - terminated_t) - V(obs_t);
                 A_t       = delta_t + gamma * lambda * (1 - done_t) * A_{t+1}.
    """
    # Everything but the recursion for all t at once: elementwise, the same numbers as row by
    # row, in a handful of ops instead of ~10 a step (a few ms a rollout on the CPU).
    done = (rollout.terminated | rollout.truncated).float()
    not_terminated = 1.0 - rollout.terminated.float()
    following = torch.cat([rollout.values[1:], next_values.unsqueeze(0)])  # V(obs_{t+1})
    bootstrap = torch.where(rollout.truncated, rollout.final_values, following)
    deltas = (rollout.rewards + gamma * bootstrap * not_terminated - rollout.values).unbind(0)
    decays = (gamma * gae_lambda * (1.0 - done)).unbind(0)
    last_gae = torch.zeros_like(next_values)
    rows = []  # A_T-1 first
    for delta, decay in zip(reversed(deltas), reversed(decays), strict=True):
        last_gae = delta + decay * last_gae
        rows.append(last_gae)
    advantages = torch.stack(rows[::-1])
    return advantages, advantages + rollout.values
