"""QMIX's pieces alone: mixers, TD(lambda) targets, epsilon, action selection, episode storage."""

from __future__ import annotations

import math

import pytest
import torch

from ddprl.algos.qmix.buffer import EpisodeBuffer, EpisodeStaging, episode_fields, truncate
from ddprl.algos.qmix.learner import epsilon_at, lambda_returns, last_actions_of, select_actions
from ddprl.algos.qmix.networks import AgentNet, QMixer, VDNMixer, agent_inputs
from ddprl.envs.marl.base import MAObs


def test_qmix_mixer_is_monotonic_in_every_agent_q():
    torch.manual_seed(0)
    mixer = QMixer(n_agents=3, state_dim=5, embed_dim=8, hypernet_layers=2, hypernet_embed=16)
    qs = torch.randn(4, 6, 3, requires_grad=True) * 10
    qs.retain_grad()
    states = torch.randn(4, 6, 5)
    mixer(qs, states).sum().backward()
    assert (qs.grad >= 0).all()
    assert (qs.grad > 0).any()


def test_one_layer_hypernetworks_are_monotonic_too():
    torch.manual_seed(1)
    mixer = QMixer(n_agents=2, state_dim=3, embed_dim=4, hypernet_layers=1, hypernet_embed=0)
    qs = torch.randn(2, 3, 2, requires_grad=True)
    (grad,) = torch.autograd.grad(mixer(qs, torch.randn(2, 3, 3)).sum(), qs)
    assert (grad >= 0).all()


def test_vdn_is_the_sum():
    qs = torch.randn(2, 3, 4)
    assert torch.equal(VDNMixer()(qs, torch.zeros(2, 3, 1)), qs.sum(-1))


def test_one_step_and_lambda_targets_by_hand():
    # Episode 0: two steps, terminated at its second. Episode 1: two steps, truncated (the
    # bootstrap comes from the value of the observation it was cut at, next_values[1, 1]).
    # A third, padded step in both.
    rewards = torch.tensor([[1.0, 2.0, 0.0], [0.5, 0.25, 0.0]])
    terminated = torch.tensor([[False, True, False], [False, False, False]])
    filled = torch.tensor([[True, True, False], [True, True, False]])
    next_values = torch.tensor([[10.0, 20.0, 99.0], [4.0, 8.0, 99.0]])
    g = 0.5
    one_step = lambda_returns(rewards, terminated, filled, next_values, gamma=g, lam=0.0)
    assert torch.allclose(one_step, torch.tensor([[1 + g * 10, 2.0, 0.0], [0.5 + g * 4, 0.25 + g * 8, 0.0]]))
    lam = 0.5
    out = lambda_returns(rewards, terminated, filled, next_values, gamma=g, lam=lam)
    g01 = 2.0  # terminal: no bootstrap
    g00 = 1 + g * ((1 - lam) * 10 + lam * g01)
    g11 = 0.25 + g * 8  # last step of a truncated episode: its own bootstrap
    g10 = 0.5 + g * ((1 - lam) * 4 + lam * g11)
    assert torch.allclose(out, torch.tensor([[g00, g01, 0.0], [g10, g11, 0.0]]))
    full = lambda_returns(rewards, terminated, filled, next_values, gamma=g, lam=1.0)  # Monte Carlo + bootstrap
    assert torch.allclose(full[1, 0], torch.tensor(0.5 + g * (0.25 + g * 8)))


def test_lambda_targets_broadcast_over_agents():
    rewards, terminated = torch.ones(1, 2, 3), torch.zeros(1, 2, 3, dtype=torch.bool)
    filled = torch.ones(1, 2, 3, dtype=torch.bool)
    out = lambda_returns(rewards, terminated, filled, torch.arange(6.0).view(1, 2, 3), gamma=1.0, lam=0.0)
    assert torch.equal(out, 1 + torch.arange(6.0).view(1, 2, 3))


def test_epsilon_schedule():
    assert epsilon_at(0, 1.0, 0.05, 100) == 1.0
    assert epsilon_at(50, 1.0, 0.05, 100) == pytest.approx(0.525)
    assert epsilon_at(100, 1.0, 0.05, 100) == pytest.approx(0.05)
    assert epsilon_at(10**6, 1.0, 0.05, 100) == pytest.approx(0.05)
    assert epsilon_at(0, 1.0, 0.05, 0) == 0.05


def test_actions_are_always_available():
    torch.manual_seed(0)
    avail = torch.rand(64, 3, 5) < 0.4
    avail[..., 2] = True  # at least one each
    qs = torch.randn(64, 3, 5)
    qs[..., 0] = 100.0  # the best action is often unavailable
    for eps in (0.0, 0.5, 1.0):
        actions = select_actions(qs, avail, eps)
        assert avail.gather(-1, actions.unsqueeze(-1)).all()
    greedy = select_actions(qs, avail, 0.0)
    assert torch.equal(greedy, qs.masked_fill(~avail, -1e9).argmax(-1))
    # epsilon 1: uniform over the available actions (each of agent 0/env 0's choices appears)
    many = select_actions(qs[:1].expand(4000, 3, 5), avail[:1].expand(4000, 3, 5), 1.0)
    assert set(many[:, 0].tolist()) == set(torch.nonzero(avail[0, 0]).flatten().tolist())


def test_agent_inputs_one_hots():
    feats = torch.zeros(2, 3, 4)  # (N, A, F)
    last = torch.tensor([[-1, 1, 0], [2, 2, -1]])
    x = agent_inputs(feats, last, n_actions=3, agent_id=True)
    assert x.shape == (2, 3, 4 + 3 + 3)
    assert torch.equal(x[0, 0, 4:7], torch.zeros(3))  # no last action at the first step
    assert torch.equal(x[0, 1, 4:7], torch.tensor([0.0, 1, 0]))
    assert torch.equal(x[1, 2, 7:], torch.tensor([0.0, 0, 1]))  # agent id 2
    assert torch.equal(last_actions_of(torch.tensor([[[1, 2]]])), torch.tensor([[[-1, -1], [1, 2]]]))


def test_rnn_unroll_equals_stepwise():
    torch.manual_seed(0)
    agent = AgentNet(5, 4, 8, use_rnn=True)
    x = torch.randn(2, 6, 3, 5)
    q = agent.unroll(x)
    h = None
    for t in range(6):
        qt, h = agent(x[:, t].reshape(6, 5), h)
        assert torch.allclose(q[:, t], qt.view(2, 3, 4), atol=1e-6)


FIELDS = episode_fields(episode_limit=4, n_agents=2, obs_dim=3, state_dim=5, n_actions=3)


def step_obs(n: int, value: float, first: bool = False) -> MAObs:
    return MAObs(
        torch.full((n, 2, 3), value),
        torch.full((n, 5), value),
        torch.ones(n, 2, 3, dtype=torch.bool),
        torch.full((n,), first),
    )


def test_staging_hands_out_padded_episodes_with_their_final_observation():
    staging = EpisodeStaging(num_envs=2, fields=FIELDS, device="cpu")
    no = torch.zeros(2, dtype=torch.bool)
    actions = torch.ones(2, 2, dtype=torch.long)
    assert staging.record(step_obs(2, 1.0, True), actions, torch.tensor([1.0, 1.0]), no, no, step_obs(2, 0.0)) is None
    # env 0 is truncated at its 2nd step (final obs 7), env 1 goes on
    ended = staging.record(
        step_obs(2, 2.0), actions * 2, torch.tensor([3.0, 3.0]), no, torch.tensor([True, False]), step_obs(2, 7.0)
    )
    assert ended["filled"].shape == (1, 4)
    assert ended["filled"][0].tolist() == [True, True, False, False]
    assert ended["reward"][0].tolist() == [1.0, 3.0, 0.0, 0.0]
    assert ended["terminated"][0].tolist() == [False] * 4
    assert ended["obs"][0, :, 0, 0].tolist() == [1.0, 2.0, 7.0, 0.0, 0.0]  # the bootstrap obs after the last step
    assert ended["state"][0, 2, 0] == 7.0
    assert ended["avail"][0, 3:].sum() == 0  # padding: nothing available
    assert ended["actions"][0, :, 0].tolist() == [1, 2, 0, 0]
    # env 0's slot starts over; env 1 terminates at its 3rd step
    ended = staging.record(
        step_obs(2, 3.0), actions, torch.tensor([5.0, 5.0]), torch.tensor([False, True]), no, step_obs(2, 9.0)
    )
    assert ended["filled"][0].tolist() == [True, True, True, False]
    assert ended["terminated"][0].tolist() == [False, False, True, False]
    assert ended["obs"][0, :4, 0, 0].tolist() == [1.0, 2.0, 3.0, 9.0]
    assert staging.t.tolist() == [1, 0]
    assert staging.data["obs"][0, 0, 0, 0] == 3.0 and staging.data["filled"][0].tolist() == [True, False, False, False]


def test_buffer_ring_sampling_and_truncation():
    buffer = EpisodeBuffer(capacity=3, fields=FIELDS, device="cpu")
    for i in range(5):  # 5 episodes of length 1 + i % 3 (ids in reward[0])
        ep = {k: torch.zeros((1, *shape), dtype=dtype) for k, (shape, dtype) in FIELDS.items()}
        ep["filled"][0, : 1 + i % 3] = True
        ep["reward"][0, 0] = float(i)
        buffer.add(ep)
    assert buffer.size == 3 and buffer.episodes_in == 5
    assert sorted(buffer.data["reward"][:, 0].tolist()) == [2.0, 3.0, 4.0]  # the oldest were overwritten
    batch = buffer.sample(3, generator=torch.Generator().manual_seed(0))
    assert sorted(batch["reward"][:, 0].tolist()) == [2.0, 3.0, 4.0]  # distinct episodes
    assert batch["filled"].shape == (3, 3) and batch["obs"].shape == (3, 4, 2, 3)  # cut to the longest (3 steps)
    with pytest.raises(ValueError):
        buffer.sample(4)
    short = truncate({"filled": torch.tensor([[True, False, False]]), "obs": torch.zeros(1, 4, 1)})
    assert short["filled"].shape == (1, 1) and short["obs"].shape == (1, 2, 1)
    restored = EpisodeBuffer(capacity=3, fields=FIELDS, device="cpu")
    restored.load_state_dict(buffer.state_dict())
    assert restored.size == 3 and torch.equal(restored.data["reward"], buffer.data["reward"])


# -- the TD loss of one batch, by hand ------------------------------------------------------------------


# Agent Qs (T+1 = 3 steps, 2 agents, 2 actions) of the live and target networks in the tests below
LIVE_QS = torch.tensor([[[1.0, 2.0], [3.0, 0.0]], [[0.5, 1.5], [2.0, 1.0]], [[4.0, 0.0], [0.0, 2.0]]])
TARGET_QS = torch.tensor([[[0.0, 0.0], [0.0, 0.0]], [[10.0, 20.0], [30.0, 40.0]], [[7.0, 1.0], [2.0, 9.0]]])


class FixedQs(torch.nn.Module):
    """A stand-in QNetwork whose agent Qs are given (B, T+1, A, U) and whose mixer adds the first
    state feature to the agents' sum: every number of the loss follows by hand."""

    def __init__(self, qs: torch.Tensor):
        super().__init__()
        self.qs = torch.nn.Parameter(qs.clone())
        self.mixer = type("Mixer", (), {"state_dim": 1})()  # what QLearner reads of a mixer

    def agent_qs(self, obs, last_actions):
        return self.qs

    def mix(self, qs, states):
        return qs.sum(-1) + states[..., 0]

    def forward(self, obs, last_actions, actions, states):
        chosen = self.qs[:, :-1].gather(-1, actions.unsqueeze(-1)).squeeze(-1)
        return self.mix(chosen, states[:, :-1]), self.qs


class OneRankOf:
    """The runtime QLearner sees: no wrapping; ``world_size`` as given (the loss scales by it)."""

    def __init__(self, world_size: int):
        self.world_size, self.device = world_size, torch.device("cpu")

    def wrap(self, module, compile=False):
        return module

    def unwrap(self, module):
        return module


@pytest.mark.parametrize("world_size", [1, 2])
@pytest.mark.parametrize("bootstrap_truncated", [True, False])
@pytest.mark.parametrize("standardise_state", [True, False])
def test_qmix_td_loss_of_a_batch_by_hand(world_size, bootstrap_truncated, standardise_state):
    """Two episodes of 2 steps (2 agents, 2 actions) padded to 3: the first terminated, the second
    cut by the time limit. One-step targets, gamma 0.5, double Q (the live Qs pick the next action
    among the available ones, the target Qs value it), rewards standardised by the reward statistics
    (mean 1, std 2), the state by the state statistics (mean 1, std 2: the state 1 becomes 0). The
    padded step's Qs are large: any of it leaking into the loss or the means shows."""
    from ddprl.algos.qmix.learner import QLearner
    from ddprl.config import load_config

    padding = torch.full((1, 2, 2), 100.0)
    live = torch.cat([LIVE_QS, padding])  # (T+1, A, U)
    target = torch.cat([TARGET_QS, padding])
    cfg = load_config(
        [
            "algo=qmix",
            "mixer=qmix",
            "gamma=0.5",
            "td_lambda=0",
            "double_q=true",
            "standardise_rewards=true",
            f"standardise_state={str(standardise_state).lower()}",
            f"bootstrap_truncated={str(bootstrap_truncated).lower()}",
        ]
    )
    learner = QLearner(OneRankOf(world_size), cfg, FixedQs(live.expand(2, -1, -1, -1)))
    learner.target = FixedQs(target.expand(2, -1, -1, -1))
    for stats in (learner.reward_stats, learner.state_stats):
        stats.mean.fill_(1.0)
        stats.var.fill_(4.0)
    avail = torch.ones(2, 4, 2, 2, dtype=torch.bool)
    avail[:, 1, 0, 1] = False  # agent 0's action 1 is not available at step 1
    avail[:, 3] = False  # padding: nothing available
    batch = {
        "obs": torch.zeros(2, 4, 2, 1),
        "state": torch.ones(2, 4, 1),
        "avail": avail,
        "actions": torch.tensor([[1, 0], [0, 0], [0, 0]]).expand(2, -1, -1),
        "reward": torch.tensor([[3.0, 5.0, 0.0], [3.0, 5.0, 0.0]]),
        "terminated": torch.tensor([[False, True, False], [False, False, False]]),
        "filled": torch.tensor([[True, True, False], [True, True, False]]),
    }
    state = 0.0 if standardise_state else 1.0  # what the mixer adds
    r0, r1 = (3.0 - 1) / 2, (5.0 - 1) / 2
    chosen0, chosen1 = 2.0 + 3.0 + state, 0.5 + 2.0 + state  # actions (1, 0) then (0, 0)
    # next actions by the live Qs: step 1 (action 1 of agent 0 unavailable) -> (0, 0); step 2 -> (0, 1)
    next1, next2 = 10.0 + 30.0 + state, 7.0 + 9.0 + state  # valued by the target Qs
    target0 = r0 + 0.5 * next1
    target1_terminated = r1
    target1_cut = r1 + 0.5 * next2 if bootstrap_truncated else r1
    td = [chosen0 - target0, chosen1 - target1_terminated, chosen0 - target0, chosen1 - target1_cut]
    global_filled = torch.tensor(4.0 * world_size)  # both ranks' valid steps
    terms = learner.loss_terms(batch, global_filled)
    assert terms["loss"].item() == pytest.approx(sum(d * d for d in td) * world_size / (4.0 * world_size))
    assert terms["td_error_abs"].item() == pytest.approx(sum(abs(d) for d in td) / 4)
    assert terms["q_taken_mean"].item() == pytest.approx((chosen0 + chosen1) / 2)
    assert terms["target_mean"].item() == pytest.approx((2 * target0 + target1_terminated + target1_cut) / 4)


def test_qmix_mixer_computes_its_formula_by_hand():
    """Hypernetworks that ignore the state (zero weights), their biases set: W1 = |[[-1, 2], [0.5, -3]]|,
    b1 = [0.5, -20], w2 = |[1, -2]|, V = 3 relu(1) - relu(1) + 0.5. Q_tot = elu(q W1 + b1) . w2 + V."""
    mixer = QMixer(n_agents=2, state_dim=1, embed_dim=2, hypernet_layers=1, hypernet_embed=8)
    with torch.no_grad():
        for p in mixer.parameters():
            p.zero_()
        mixer.hyper_w1.bias.copy_(torch.tensor([-1.0, 2.0, 0.5, -3.0]))  # (A, E) row by row
        mixer.hyper_b1.bias.copy_(torch.tensor([0.5, -20.0]))
        mixer.hyper_w2.bias.copy_(torch.tensor([1.0, -2.0]))
        mixer.hyper_v[0].bias.fill_(1.0)
        mixer.hyper_v[2].weight.copy_(torch.tensor([[3.0, -1.0]]))
        mixer.hyper_v[2].bias.fill_(0.5)
    q = torch.tensor([[[2.0, 4.0]]])  # (B=1, T=1, A=2)
    # q W1 = [2 * 1 + 4 * 0.5, 2 * 2 + 4 * 3] = [4, 16]; + b1 = [4.5, -4]; elu -> [4.5, e^-4 - 1]
    expected = 4.5 * 1.0 + (math.exp(-4.0) - 1.0) * 2.0 + (3.0 - 1.0 + 0.5)
    out = mixer(q, torch.randn(1, 1, 1))
    assert out.shape == (1, 1) and out.item() == pytest.approx(expected, rel=1e-6)


class AgentQs(FixedQs):
    """FixedQs without a mixer: each agent's Q is its own (independent Q-learning, mixer=none)."""

    def mix(self, qs, states):
        return qs


def _update_batch() -> dict[str, torch.Tensor]:
    avail = torch.ones(2, 3, 2, 2, dtype=torch.bool)
    avail[:, 1, 0, 1] = False
    return {
        "obs": torch.zeros(2, 3, 2, 1),
        "state": torch.tensor([1.0, 3.0, 5.0]).view(1, 3, 1).expand(2, -1, -1).clone(),
        "avail": avail,
        "actions": torch.tensor([[1, 0], [0, 0]]).expand(2, -1, -1),
        "reward": torch.tensor([[3.0, 5.0], [3.0, 5.0]]),
        "terminated": torch.tensor([[False, True], [False, False]]),
        "filled": torch.ones(2, 2, dtype=torch.bool),
    }


class OneRankUpdating(OneRankOf):
    def __init__(self):
        super().__init__(1)

    def all_reduce_sum(self, value):
        return value

    def no_sync(self, module, enabled=True):
        import contextlib

        return contextlib.nullcontext()


@pytest.mark.parametrize("standardise_state", [True, False])
def test_qmix_update_merges_the_batch_statistics_it_standardises_with(standardise_state):
    """The update's reward statistics take the batch's valid rewards (3, 5, 3, 5), its state statistics
    the states of every valid step and its bootstrap step (1, 3, 5 per episode), only when asked."""
    from ddprl.algos.qmix.learner import QLearner
    from ddprl.config import load_config

    cfg = load_config(
        ["algo=qmix", "mixer=qmix", "standardise_rewards=true", f"standardise_state={str(standardise_state).lower()}"]
    )
    learner = QLearner(OneRankUpdating(), cfg, FixedQs(LIVE_QS.expand(2, -1, -1, -1)))
    learner.target = FixedQs(TARGET_QS.expand(2, -1, -1, -1))
    # the loss the update reports: its batch's TD loss over its 4 valid steps, with the merged statistics
    twin = QLearner(OneRankUpdating(), cfg, FixedQs(LIVE_QS.expand(2, -1, -1, -1)))
    twin.target = learner.target
    twin.reward_stats.update(torch.tensor([3.0, 5.0, 3.0, 5.0]))
    twin.state_stats.update(torch.tensor([1.0, 3.0, 5.0] * 2).view(6, 1))
    expected = twin.loss_terms(_update_batch(), torch.tensor(4.0))["loss"].item()
    metrics = learner.update([_update_batch()])
    assert metrics["loss"] == pytest.approx(expected, rel=1e-6)
    assert float(learner.reward_stats.count) == 4 and float(learner.reward_stats.mean) == pytest.approx(4.0)
    assert float(learner.reward_stats.var) == pytest.approx(1.0)
    if standardise_state:
        assert float(learner.state_stats.count) == 6 and float(learner.state_stats.mean) == pytest.approx(3.0)
        assert float(learner.state_stats.var) == pytest.approx(8 / 3)
    else:
        assert float(learner.state_stats.count) == 0


def test_independent_q_learning_averages_the_td_error_over_agents_by_hand():
    """mixer=none: every agent's own TD error, the loss their squares' mean over valid steps and
    agents. One-step targets, gamma 0.5, double Q, the team reward for each agent."""
    from ddprl.algos.qmix.learner import QLearner
    from ddprl.config import load_config

    cfg = load_config(
        ["algo=qmix", "mixer=none", "gamma=0.5", "td_lambda=0", "double_q=true", "standardise_rewards=false"]
    )
    learner = QLearner(OneRankUpdating(), cfg, AgentQs(LIVE_QS.expand(2, -1, -1, -1)))
    learner.target = AgentQs(TARGET_QS.expand(2, -1, -1, -1))
    metrics = learner.update([_update_batch()])
    # chosen: step 0 (2, 3), step 1 (0.5, 2); next actions by the live Qs: step 1 (0, 0), step 2 (0, 1)
    # targets: step 0: 3 + 0.5 (10, 30) = (8, 18); step 1: terminated (5, 5), cut 5 + 0.5 (7, 9) = (8.5, 9.5)
    td = [2 - 8, 3 - 18, 0.5 - 5, 2 - 5] + [2 - 8, 3 - 18, 0.5 - 8.5, 2 - 9.5]
    assert metrics["loss"] == pytest.approx(sum(d * d for d in td) / 8)
    assert metrics["td_error_abs"] == pytest.approx(sum(abs(d) for d in td) / 8)


@pytest.mark.parametrize("max_grad_norm, expected", [(0.5, 0.5), (10.0, 10.0), (0.0, math.inf)])
def test_qmix_update_clips_the_gradient_at_max_grad_norm(monkeypatch, max_grad_norm, expected):
    from ddprl.algos.qmix.learner import QLearner
    from ddprl.config import load_config

    bounds = []
    clip = torch.nn.utils.clip_grad_norm_
    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", lambda p, m: (bounds.append(m), clip(p, m))[1])
    cfg = load_config(["algo=qmix", "mixer=none", f"max_grad_norm={max_grad_norm}"])
    learner = QLearner(OneRankUpdating(), cfg, AgentQs(LIVE_QS.expand(2, -1, -1, -1)))
    learner.target = AgentQs(TARGET_QS.expand(2, -1, -1, -1))
    learner.update([_update_batch()])
    assert bounds == [expected]
