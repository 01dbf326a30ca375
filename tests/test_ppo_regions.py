"""PPO's rollout step and update step as compiled regions (``compile=true``) on the CPU: each is
one graph without host reads, and compiled it computes what it computes eagerly; the update
equals a plain backward + ``torch.optim.Adam`` loop (one process and 2 gloo ranks); the loop
runs and resumes on the regions.

Compiling on a 2-core CPU is slow (15-40 s a region): only the tests named ``compiled`` run
inductor, on tiny networks; the others trace (``capture_graphs``) or run the regions eagerly.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math

import dist_fns
import gymnasium as gym
import pytest
import torch

from ddprl.algos.graphs import capture_graphs, host_syncs, training_step_unsupported
from ddprl.algos.ppo import loop
from ddprl.algos.ppo import rollout as ppo_rollout
from ddprl.algos.ppo import update as ppo_update
from ddprl.algos.ppo.loop import train
from ddprl.algos.ppo.loss import ppo_loss
from ddprl.algos.ppo.networks import ActorCritic
from ddprl.algos.ppo.rollout import RolloutBuffer, RolloutStep
from ddprl.algos.ppo.update import UpdateStep, learn
from ddprl.config import load_config
from ddprl.envs.snake import SnakeEnv
from ddprl.metrics import read_metrics
from ddprl.normalize import RunningMeanStd
from ddprl.prepare import prepare_train
from ddprl.runtime import compat, launch

# Regions need a torch whose Dynamo traces torch.func through modules (2.13 does, 2.4 does not):
# there compile=true falls back (PPO) or is refused (TD-MPC2), and these checks have nothing to check.
pytestmark = pytest.mark.skipif(training_step_unsupported() is not None, reason=str(training_step_unsupported()))

PRECISIONS = {"fp32": contextlib.nullcontext, "bf16": lambda: torch.autocast("cpu", dtype=torch.bfloat16)}


class LocalRuntime:
    """``rt`` of a world of one without a process group: the verbs ``learn`` and the steps call."""

    world_size = 1
    device = torch.device("cpu")

    @staticmethod
    def region_mean(tensor):
        return tensor

    @staticmethod
    def all_reduce_mean(value):
        return value

    @staticmethod
    def no_sync(module, enabled=True):
        return contextlib.nullcontext()


def snake_rollout(
    compile=False, unroll=2, n_steps=4, num_envs=8, precision="fp32", norm_obs=False, env_cls=SnakeEnv, device="cpu"
):
    """A tiny Snake rollout region (5x5 board, a 1-conv CNN), with its env, policy and buffer."""
    env = env_cls(num_envs, grid_size=5, seed=3, device=device)
    torch.manual_seed(0)
    policy = ActorCritic(
        env.single_observation_space,
        env.single_action_space,
        policy="cnn",
        policy_width=4,
        policy_depth=1,
        hidden_sizes=[16],
    ).to(device)
    obs_shape = tuple(env.single_observation_space.shape)
    buffer = RolloutBuffer(n_steps, num_envs, obs_shape, (), torch.long, env.device)
    normalize = lambda x: x  # noqa: E731
    if norm_obs:
        rms = RunningMeanStd(obs_shape).to(device)
        rms.update(torch.rand(32, *obs_shape, device=device))
        normalize = rms.normalize
    rollout = RolloutStep(env, policy, buffer, normalize, PRECISIONS[precision](), unroll, compile=compile)
    return rollout


def fixed_batch(n=96, seed=3):
    """A flat PPO batch of ``n`` samples for a 4-d observation, 3 actions (what ``learn`` reads)."""
    g = torch.Generator().manual_seed(seed)
    return {
        "obs": torch.randn(n, 4, generator=g),
        "actions": torch.randint(0, 3, (n,), generator=g),
        "log_probs": -1.1 + 0.1 * torch.randn(n, generator=g),
        "values": torch.randn(n, generator=g),
        "advantages": torch.randn(n, generator=g),
        "returns": torch.randn(n, generator=g),
    }


def mlp_agent():
    torch.manual_seed(0)
    return ActorCritic(gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(3), hidden_sizes=[16])


def ppo_cfg(**keys):
    base = {
        "num_envs": 8,
        "n_steps": 12,
        "batch_size": 32,
        "epochs": 2,
        "max_grad_norm": 0.5,
        "ent_coef": 0.01,
        "world_size": 1,
    }
    base.update(keys)
    return load_config([f"{k}={v}" for k, v in base.items()])


def region_update(batch, cfg, compile=False, precision="fp32", normalize=lambda x: x, device="cpu", functional=True):
    agent = mlp_agent().to(device)
    optimizer = torch.optim.Adam(agent.parameters(), lr=1e-2, eps=1e-5)
    region_batch = {k: v.to(device, copy=True) for k, v in batch.items()}
    return agent, UpdateStep(
        LocalRuntime(),
        agent,
        optimizer,
        region_batch,
        cfg,
        normalize,
        PRECISIONS[precision](),
        compile=compile,
        functional=functional,
    )


def reference_learn(agent, optimizer, batch, cfg):
    """PPO's update phase written plainly: ``loss.backward()`` accumulated over ``sync_freq``
    minibatches, ``clip_grad_norm_``, ``torch.optim.Adam``; the same minibatches (one randperm
    per epoch), the same KL early stop and metrics as ``learn``; ``norm_adv=minibatch``:
    advantages standardised over each optimizer step's minibatches."""
    n = batch["obs"].shape[0]
    num_minibatches, k = n // cfg.batch_size, cfg.sync_freq
    sums, count, epochs_done = {}, 0, 0
    for _ in range(cfg.epochs):
        perm = torch.randperm(n)
        epoch_kl = 0.0
        for i in range(num_minibatches):
            idx = perm[i * cfg.batch_size : (i + 1) * cfg.batch_size]
            group_start = (i // k) * k
            group_size = min(k, num_minibatches - group_start)
            advantages = batch["advantages"][idx]
            if cfg.norm_adv == "minibatch":  # standardised with the statistics of the step's minibatches
                group = batch["advantages"][
                    perm[group_start * cfg.batch_size : (group_start + group_size) * cfg.batch_size]
                ]
                advantages = (advantages - group.mean()) / (group.std(correction=0) + 1e-8)
            terms = ppo_loss(
                agent(batch["obs"][idx], batch["actions"][idx]),
                batch["log_probs"][idx],
                batch["values"][idx],
                advantages,
                batch["returns"][idx],
                cfg.clip_coef,
                cfg.clip_vloss,
                cfg.vf_coef,
                cfg.ent_coef,
            )
            (terms["loss"] / group_size).backward()
            if i - group_start == group_size - 1:
                if cfg.max_grad_norm > 0:
                    torch.nn.utils.clip_grad_norm_(agent.parameters(), cfg.max_grad_norm)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            for key, value in terms.items():
                sums[key] = sums.get(key, 0.0) + float(value.detach())
            epoch_kl += float(terms["approx_kl"])
            count += 1
        epochs_done += 1
        if cfg.target_kl is not None and epoch_kl / num_minibatches > cfg.target_kl:
            break
    metrics = {f"train/{key}": value / count for key, value in sums.items()}
    metrics["train/epochs"] = float(epochs_done)
    return metrics


def eager_learn(batch, cfg, seed=5, lrs=(1e-2,)):
    """The reference: ``reference_learn`` with torch.optim.Adam, backward and clip_grad_norm_; once per lr."""
    agent = mlp_agent()
    optimizer = torch.optim.Adam(agent.parameters(), lr=lrs[0], eps=1e-5)
    metrics = []
    torch.manual_seed(seed)
    for lr in lrs:
        optimizer.param_groups[0]["lr"] = lr
        metrics.append(reference_learn(agent, optimizer, batch, cfg))
    return agent, metrics


def assert_same_weights(a, b, atol):
    for (name, p), q in zip(a.named_parameters(), b.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=0, atol=atol, msg=name)


# -- each region is one graph, without host reads ----------------------------------------------------


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_rollout_region_is_one_graph_without_host_reads(precision):
    rollout = snake_rollout(precision=precision, norm_obs=True)
    rollout.policy.fill_noise_(rollout.action_noise)
    rollout.env.draw_into(rollout.env_noise)
    with torch.no_grad():
        graphs = capture_graphs(rollout.steps, rollout.action_noise, rollout.env_noise)
    assert len(graphs) == 1
    assert host_syncs(graphs) == []


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_update_region_is_one_graph_without_host_reads(precision):
    batch = fixed_batch()
    rms = RunningMeanStd((4,))
    rms.update(batch["obs"])
    # norm_adv=minibatch: the advantages' statistics are computed in the region too
    cfg = ppo_cfg(sync_freq=2, norm_adv="minibatch")
    _, update = region_update(batch, cfg, precision=precision, normalize=rms.normalize)
    with torch.no_grad():
        graphs = capture_graphs(update.step_eager, torch.randperm(96)[:64].view(2, 32))  # sync_freq=2: 2 minibatches
    assert len(graphs) == 1
    assert host_syncs(graphs) == []


class UpdateReadingTheHost(UpdateStep):
    def loss(self, params, idx, advantages):
        loss, terms = super().loss(params, idx, advantages)
        return loss, terms + terms.cpu()


class SnakeReadingTheHost(SnakeEnv):
    how = "item"

    def advance(self, actions, rnd):
        out = super().advance(actions, rnd)
        if self.how == "item":
            self.ep_return.add_(out[1].sum().item() * 0.0)
        elif out[1].sum() > 100:  # a Python branch on a tensor's value
            self.ep_return.add_(1.0)
        return out


@pytest.mark.parametrize("how", ["cpu", "item", "branch"])
def test_the_checks_catch_a_host_read_put_into_a_region(how):
    """``.cpu()`` or ``.item()`` in a copy of a region is listed by ``host_syncs``; a branch on a
    tensor's value cannot be captured in one graph at all."""
    if how == "cpu":
        agent = mlp_agent()
        update = UpdateReadingTheHost(
            LocalRuntime(),
            agent,
            torch.optim.Adam(agent.parameters()),
            fixed_batch(),
            ppo_cfg(),
            lambda x: x,
            contextlib.nullcontext(),
            functional=True,
        )
        fn, args = update.step_eager, (torch.randperm(96)[:32].view(1, 32),)
    else:
        SnakeReadingTheHost.how = how
        rollout = snake_rollout(env_cls=SnakeReadingTheHost)
        noise = (rollout.policy.fill_noise_(rollout.action_noise), rollout.env.draw_into(rollout.env_noise))
        fn, args = rollout.steps, noise
    with torch.no_grad():
        if how == "branch":
            with pytest.raises(Exception, match="(?i)data-dependent|graph break|generic_jump|Unsupported"):
                capture_graphs(fn, *args)
            return
        graphs = capture_graphs(fn, *args)
    assert any(s.startswith(how) for s in host_syncs(graphs)), host_syncs(graphs)


def test_a_rollout_region_that_breaks_its_graph_says_so_and_runs_eagerly():
    """``compile=true`` with an env whose step branches on a tensor's value: the rollout region
    cannot be one graph, says so once (WARNING) and stores what the eager region stores."""
    SnakeReadingTheHost.how = "branch"
    lines = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append((record.levelname, record.getMessage()))
    logger, level = logging.getLogger("ddprl"), logging.getLogger("ddprl").level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    runs = []
    try:
        for compile in (False, True):
            rollout = snake_rollout(compile=compile, env_cls=SnakeReadingTheHost, unroll=2, n_steps=4)
            torch.manual_seed(1)
            runs.append((rollout, [torch.stack(rollout.collect()) for _ in range(2)]))
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    (eager, eager_sums), (fallen, fallen_sums) = runs
    assert fallen.region.eager
    for name, a, b in zip(eager.buffer.data._fields, eager.buffer.data, fallen.buffer.data, strict=True):
        assert torch.equal(a, b), name
    assert all(torch.equal(a, b) for a, b in zip(eager_sums, fallen_sums, strict=True))
    assert len(lines) == 1 and lines[0][0] == "WARNING", lines
    assert lines[0][1].startswith("compile=true: region ppo rollout: graph break (") and lines[0][1].endswith(
        "in advance); it runs eagerly from now on"
    ), lines


# -- the rollout region stores what a plain step loop stores ----------------------------------------


def test_rollout_region_stores_what_a_step_loop_stores():
    """Eagerly, the region's K unrolled steps per call, its buffer cursor and its episode sums
    equal a plain loop of ``act_with_noise`` + ``env.advance`` on the same random draws."""
    rollout = snake_rollout(unroll=2, n_steps=6, num_envs=16)
    torch.manual_seed(1)
    returns, count = rollout.collect()
    returns, count = rollout.collect()  # the second rollout continues the games of the first

    ref = snake_rollout(unroll=2, n_steps=6, num_envs=16)
    env, policy, noise, rnd = ref.env, ref.policy, ref.action_noise, ref.env_noise
    torch.manual_seed(1)
    for _ in range(2):
        stored, ep_return, ep_count = {k: [] for k in ref.buffer.data._fields}, 0.0, 0
        for t in range(6):
            if t % 2 == 0:  # the region draws its K steps' noise before each call
                policy.fill_noise_(noise), env.draw_into(rnd)
            obs = env.observe()
            with torch.no_grad():
                action, log_prob, value = policy.act_with_noise(obs, noise[t % 2])
                _, reward, terminated, truncated, info = env.advance(action, rnd[t % 2])
                final_values = policy.value(info["final_obs"])
            for k, v in zip(
                ref.buffer.data._fields,
                (obs, action, log_prob, value, reward, terminated, truncated, final_values),
                strict=True,
            ):
                stored[k].append(v)
            done = terminated | truncated
            ep_return += float((info["episode_return"] * done).sum())
            ep_count += int(done.sum())
    for k, got in zip(ref.buffer.data._fields, rollout.buffer.data, strict=True):
        torch.testing.assert_close(got, torch.stack(stored[k]), rtol=0, atol=0, msg=k)
    assert ep_count > 0 and (float(returns), int(count)) == (pytest.approx(ep_return), ep_count)


def test_act_with_noise_samples_the_policy():
    """Gumbel-max on Exp(1) draws samples Categorical(logits); Box actions are mean + std * noise."""
    torch.manual_seed(0)
    net = ActorCritic(gym.spaces.Box(-1, 1, (3,)), gym.spaces.Discrete(3), hidden_sizes=[8])
    with torch.no_grad():
        net.actor[-1].bias.copy_(torch.tensor([0.0, 1.0, -1.0]))
    obs = torch.zeros(40_000, 3)
    noise = net.fill_noise_(torch.empty(40_000, *net.noise_shape))
    action, log_prob, _ = net.act_with_noise(obs, noise)
    probs = net.distribution(net.trunk(obs[:1])).probs[0]
    torch.testing.assert_close(torch.bincount(action, minlength=3).float() / len(action), probs, rtol=0, atol=0.01)
    torch.testing.assert_close(log_prob, net(obs, action).log_prob)
    cont = ActorCritic(gym.spaces.Box(-1, 1, (3,)), gym.spaces.Box(-1, 1, (2,)), hidden_sizes=[8])
    with torch.no_grad():
        cont.log_std.fill_(math.log(0.5))
    noise = cont.fill_noise_(torch.empty(40_000, *cont.noise_shape))
    action, log_prob, _ = cont.act_with_noise(obs, noise)
    mean = cont.eval_action(obs)
    torch.testing.assert_close(action, mean + 0.5 * noise)
    torch.testing.assert_close(log_prob, cont(obs, action).log_prob)


# -- the update region equals learn ------------------------------------------------------------------


@pytest.mark.parametrize("norm_adv", [True, "minibatch"])
@pytest.mark.parametrize("functional", [True, False], ids=["torch.func", "autograd"])
def test_update_region_equals_learn_with_accumulation_and_clipping(functional, norm_adv):
    """Eagerly, the region's gradients (torch.func, or autograd as ``compile=false`` takes them),
    sync_freq accumulation (3 minibatches in groups of 2: the last group is shorter), norm clip
    and Adam equal a plain loop's backward accumulation, clip_grad_norm_ and torch.optim.Adam
    over 2 epochs; with ``norm_adv=minibatch``, each group's advantages standardised as well."""
    batch, cfg = fixed_batch(), ppo_cfg(sync_freq=2, epochs=2, max_grad_norm=0.05, norm_adv=str(norm_adv).lower())
    ref, ref_metrics = eager_learn(batch, cfg)
    agent, update = region_update(batch, cfg, functional=functional)
    torch.manual_seed(5)
    metrics = learn(LocalRuntime(), update, cfg)
    assert_same_weights(ref, agent, atol=1e-6)
    assert metrics == pytest.approx(ref_metrics[0], rel=1e-5, abs=1e-6)
    assert (
        max((p - q).abs().max() for p, q in zip(mlp_agent().parameters(), agent.parameters(), strict=True)) > 1e-3
    )  # it moved


def test_compiled_update_equals_learn_and_follows_the_lr_without_recompiling():
    """Compiled (inductor), 2 epochs x 3 optimizer steps, then 2 more epochs at another learning
    rate (annealing): the weights equal ``learn``'s, and the new lr compiles nothing new (the
    region neither recompiled nor fell back to eager)."""
    batch, cfg = fixed_batch(), ppo_cfg(epochs=2)
    ref, ref_metrics = eager_learn(batch, cfg, lrs=(1e-2, 3e-3))
    agent, update = region_update(batch, cfg, compile=True)
    torch.manual_seed(5)
    first = learn(LocalRuntime(), update, cfg)
    assert update.region.graphs == 1 and not update.region.eager
    update.optimizer.param_groups[0]["lr"] = 3e-3
    second = learn(LocalRuntime(), update, cfg)
    assert update.region.graphs == 1 and not update.region.eager
    assert_same_weights(ref, agent, atol=1e-5)
    assert [first, second] == [pytest.approx(m, rel=1e-4, abs=1e-6) for m in ref_metrics]


# -- compiled == eager: the rollout region ------------------------------------------------------------


def test_compiled_rollout_equals_eager():
    """Compiled (inductor), 2 steps per graph, two rollouts of 4 steps: the stored rollout (and
    the env state it leaves) equals the eager region's on the same random draws."""
    runs = []
    for compile in (False, True):
        rollout = snake_rollout(compile=compile, unroll=2, n_steps=4, num_envs=16)
        torch.manual_seed(1)
        sums = [torch.stack(rollout.collect()) for _ in range(2)]
        runs.append((rollout, sums))
    (eager, eager_sums), (compiled, compiled_sums) = runs
    for name, a, b in zip(eager.buffer.data._fields, eager.buffer.data, compiled.buffer.data, strict=True):
        if a.is_floating_point() and name != "obs":  # network outputs: inductor's own kernels
            torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5, msg=name)
        else:  # the game and the sampled actions: exactly
            assert torch.equal(a, b), name
    assert all(torch.equal(a, b) for a, b in zip(eager_sums, compiled_sums, strict=True))
    assert torch.equal(eager.env.body, compiled.env.body) and torch.equal(eager.env.food, compiled.env.food)
    assert int(compiled.cursor) == 4
    assert (compiled.region.graphs, compiled.region.eager) == (1, False)  # compiled, not fallen back


# -- data parallel: 2 gloo ranks on halves == one process on the whole batch ----------------------------


@pytest.mark.slow
def test_update_region_two_ranks_equal_one_process(tmp_path):
    """Update regions on 2 ranks (gradients averaged inside the graph by one all-reduce: the
    shared-memory op on one machine, gloo's functional collective elsewhere; rank 1's different
    initial weights replaced by ``rt.broadcast_module``), each on half the batch == eager
    ``learn`` in one process on the whole batch, with the global norm clip acting
    on every step. Captured whole (fullgraph) with the ``aot_eager`` backend: inductor's codegen
    would add a minute of compiling per rank on 2 cores, and is covered by the one-rank tests."""
    n = 64
    batch = fixed_batch(n)
    batch["actions"] %= 2  # dist_fns.make_agent has 2 actions
    path = tmp_path / "batch.pt"
    torch.save(batch, path)
    common = {"epochs": 3, "max_grad_norm": 0.05, "num_envs": 4, "n_steps": 32, "dist_timeout": 120}
    single = ppo_cfg(batch_size=n, **common)
    ref_agent = dist_fns.make_agent()
    optimizer = torch.optim.Adam(ref_agent.parameters(), lr=1e-2, eps=1e-5)
    reference_learn(ref_agent, optimizer, batch, single)
    cfg = ppo_cfg(batch_size=n // 2, **{**common, "world_size": 2})
    launch(
        functools.partial(dist_fns.ppo_learn_compiled, out=str(tmp_path), batch_path=str(path), backend="aot_eager"),
        cfg,
    )
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    for name, p in ref_agent.state_dict().items():
        torch.testing.assert_close(ranks[0]["params"][name], p, rtol=0, atol=1e-5, msg=name)
        assert torch.equal(ranks[0]["params"][name], ranks[1]["params"][name]), name
    assert ranks[0]["metrics"] == ranks[1]["metrics"]


# -- the loop on the regions: runs, logs, resumes exactly ----------------------------------------------


def test_plan_says_what_stays_out_of_the_graphs():
    cfg = load_config(["task=snake", "compile=true", "n_steps=12", "compile_unroll=5"])
    snake = SnakeEnv(2, grid_size=5)
    assert loop.plan(cfg, snake) == loop.Plan(update=True, unroll=4)  # the largest divisor of 12 <= 5
    assert loop.plan(load_config(["compile=true", "n_steps=7", "compile_unroll=4"]), snake).unroll == 1
    assert loop.plan(load_config(["compile=false"]), snake) == loop.Plan(update=False, unroll=0)
    lines = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())
    logger, level = logging.getLogger("ddprl"), logging.getLogger("ddprl").level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        host_env = object()  # no traceable_step: a Gymnasium vector env, DMC
        assert loop.plan(load_config(["compile=true", "precision=fp16"]), host_env) == loop.Plan(False, 0)
        assert loop.plan(load_config(["compile=true"]), host_env, joint=True) == loop.Plan(True, 0)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    assert lines == [
        "compile=true: torch.compile of the model; the update runs eagerly on the compiled model "
        "(precision=fp16: GradScaler skips steps on the host); the rollout compiles only the policy "
        "(object steps outside a graph)",
        "compile=true: update as one graph per optimizer step; the rollout acts eagerly (actor and critic as "
        "one network: cheaper than compiled on a CPU)",
    ]


class TwoRanks(LocalRuntime):
    """A world of two seen from one rank: ``all_reduce_sum`` adds what the other rank says."""

    world_size = 2

    def __init__(self, peer_cannot: bool, device: str = "cpu"):
        self.peer_cannot, self.device = peer_cannot, torch.device(device)

    def all_reduce_sum(self, values):
        return {key: value + float(self.peer_cannot) for key, value in values.items()}


def test_compile_auto_compiles_long_cpu_runs_where_every_rank_can(monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger="ddprl")
    choose = loop.compile_choice
    many, few = loop.COMPILE_AUTO, loop.COMPILE_AUTO - 1
    assert choose(TwoRanks(False), True, 1) is True and choose(TwoRanks(True), False, many) is False  # as given
    assert choose(TwoRanks(False), "auto", few) is False and not caplog.messages  # short: eager, nothing said
    if training_step_unsupported() is None and loop.cpp_compiler() is not None:
        assert choose(TwoRanks(False), "auto", many) is True
        assert caplog.messages[-1].startswith(f"compile=auto: compiled, for {many} optimizer steps")
    assert choose(TwoRanks(True), "auto", many) is False  # the other rank cannot: neither compiles
    assert caplog.messages[-1] in (
        "compile=auto: eager: 1 of 2 ranks cannot compile",
        f"compile=auto: eager: {training_step_unsupported()}",
        "compile=auto: eager: no C++ compiler (g++, c++, clang++) to build torch.compile's CPU code",
    )
    assert choose(TwoRanks(False, "cuda"), "auto", many) is False
    assert "on cuda compiled updates are not measured yet" in caplog.messages[-1]
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.delenv("CXX", raising=False)
    assert loop.cpp_compiler() is None
    assert choose(TwoRanks(False), "auto", many) is False
    if training_step_unsupported() is None:
        assert (
            caplog.messages[-1]
            == "compile=auto: eager: no C++ compiler (g++, c++, clang++) to build torch.compile's CPU code"
        )


@pytest.mark.parametrize("threshold", [1, 10**9])
def test_compile_auto_reaches_the_loop_as_true_or_false(tmp_path, monkeypatch, capfd, threshold):
    """The choice is what the rollout and the update are built with (regions run eagerly here)."""
    monkeypatch.setattr(ppo_rollout, "compile_region", lambda fn, *args, **kwargs: fn)
    monkeypatch.setattr(ppo_update, "compile_region", lambda fn, *args, **kwargs: fn)
    monkeypatch.setattr(loop, "COMPILE_AUTO", threshold)
    monkeypatch.setattr(loop, "cpp_compiler", lambda: "/usr/bin/g++")  # compiling itself is skipped above
    keys = ["task=snake", "world_size=1", "num_envs=8", "n_steps=4", "batch_size=16", "epochs=1", "steps=32"]
    keys += ["eval_episodes=0", "progress=false", "policy=cnn", "policy_width=4", "policy_depth=1"]
    keys += ["hidden_sizes=[16]", "env_kwargs={grid_size: 5}", "device=cpu", f"run_dir={tmp_path}"]
    launch(train, prepare_train(keys, None))  # compile: auto, the default
    err = capfd.readouterr().err
    compiled = threshold == 1 and training_step_unsupported() is None
    assert ("compile=auto: compiled, for 2 optimizer steps" in err) == compiled
    assert ("rollout as graphs of 2 env steps, update as one graph per optimizer step" in err) == compiled
    assert [r["step"] for r in read_metrics(tmp_path)] == [32]


def test_train_on_regions_resumes_to_the_same_parameters(tmp_path, monkeypatch, capfd):
    """``compile=true`` on Snake runs the loop on both regions (run eagerly here: the compiled ==
    eager tests above cover inductor); interrupted and resumed == never interrupted."""
    monkeypatch.setattr(ppo_rollout, "compile_region", lambda fn, *args, **kwargs: fn)
    monkeypatch.setattr(ppo_update, "compile_region", lambda fn, *args, **kwargs: fn)
    common = [
        "task=snake",
        "world_size=1",
        "num_envs=8",
        "n_steps=4",
        "batch_size=16",
        "epochs=2",
        "sync_freq=2",
        "steps=96",
        "checkpoint_freq=64",
        "eval_episodes=0",
        "progress=false",
        "compile=true",
        "policy=cnn",
        "policy_width=4",
        "policy_depth=1",
        "hidden_sizes=[16]",
        "env_kwargs={grid_size: 5}",
        "norm_obs=true",
        "target_kl=1.0",
        "device=cpu",
    ]
    launch(train, prepare_train([*common, f"run_dir={tmp_path / 'a'}"], None))
    assert "rollout as graphs of 2 env steps, update as one graph per optimizer step" in capfd.readouterr().err
    records = read_metrics(tmp_path / "a")
    assert [r["step"] for r in records] == [32, 64, 96]
    assert all(math.isfinite(r["train/loss"]) and r["train/epochs"] >= 1 for r in records)
    assert any("train/episode_return" in r for r in records)
    mid = tmp_path / "a" / "checkpoints" / "step_64.pt"
    launch(train, prepare_train([*common, f"resume={mid}", f"run_dir={tmp_path / 'b'}"], None))
    full = torch.load(tmp_path / "a" / "checkpoints" / "step_96.pt", weights_only=True)["state"]
    resumed = torch.load(tmp_path / "b" / "checkpoints" / "step_96.pt", weights_only=True)["state"]
    for k in full["model"]:
        assert torch.equal(full["model"][k], resumed["model"][k]), k


# -- CUDA: the regions are replayed as CUDA graphs ------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_regions_replay_as_cuda_graphs_without_host_syncs():
    """On one CUDA device both regions are recorded as CUDA graphs (none skipped: every tensor
    they write is at a static address), their replays never wait for the device, and they
    compute what their eager forms compute."""
    skips = compat.cudagraph_skip_count()
    rollouts = []
    for compile in (False, True):
        rollout = snake_rollout(compile=compile, unroll=2, n_steps=4, num_envs=64, device="cuda")
        torch.manual_seed(1)
        rollout.collect(), rollout.collect()  # compiles, warms up and records the graph
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            sums = torch.stack(rollout.collect())
        finally:
            torch.cuda.set_sync_debug_mode("default")
        assert not compile or (rollout.region.graphs, rollout.region.eager) == (1, False)
        rollouts.append((rollout.buffer.data, sums))
    (eager, eager_sums), (compiled, compiled_sums) = rollouts
    for name, a, b in zip(eager._fields, eager, compiled, strict=True):
        if a.is_floating_point() and name != "obs":
            torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-4, msg=name)
        else:
            assert torch.equal(a, b), name
    assert torch.equal(eager_sums, compiled_sums)

    batch, cfg = fixed_batch(), ppo_cfg(epochs=2)
    agents = []
    for compile in (False, True):
        agent, update = region_update(batch, cfg, compile=compile, device="cuda")
        torch.manual_seed(5)
        learn(LocalRuntime(), update, cfg)
        idx = torch.randperm(96, device="cuda")[:32].view(1, 32)
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            update.step(idx)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        assert not compile or not update.region.eager
        agents.append(agent)
    assert_same_weights(agents[0], agents[1], atol=1e-5)
    assert compat.cudagraph_skip_count() == skips
