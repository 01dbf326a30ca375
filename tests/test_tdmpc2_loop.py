"""TD-MPC2 losses, update and loop: hand-computed terms, 2-rank gloo equivalences, end to end.

Distributed checks (docs/distributed.md invariants 1, 2, 5, 8; the failures of
docs/references.md#failures-of-distributed-rl-that-ddprl-guards-against):
N ranks on N shares of a batch == one process on the whole batch (with the randomness of
an update fixed: same Q-member pair on every rank, given policy noise, dropout 0); target Qs
and the Q scale identical on every rank; a 2-rank checkpoint evaluates in one process; a
run writes its directory and resumes. All on CPU with gloo, tiny models.
"""

from __future__ import annotations

import functools
import math
from pathlib import Path

import pytest
import torch

pytest.importorskip("dm_control")

from conftest import TDMPC2_TINY, run_cli  # noqa: E402

from ddprl.algos.graphs import training_step_unsupported  # noqa: E402
from ddprl.algos.tdmpc2.acting import Acting, EpisodeRecorder  # noqa: E402
from ddprl.algos.tdmpc2.buffer import TrajectoryBatch  # noqa: E402
from ddprl.algos.tdmpc2.env import UnitBoxActions, episode_length_of, make_tdmpc2_env  # noqa: E402
from ddprl.algos.tdmpc2.learner import UpdateNoise, build_learner, draw_noise, model_dims, update  # noqa: E402
from ddprl.algos.tdmpc2.loop import load_actor  # noqa: E402
from ddprl.algos.tdmpc2.loss import policy_loss, rho_weights, world_model_loss  # noqa: E402
from ddprl.algos.tdmpc2.math import NUM_BINS, RunningScale, two_hot  # noqa: E402
from ddprl.algos.tdmpc2.networks import WorldModel  # noqa: E402
from ddprl.checkpoint import load_checkpoint  # noqa: E402
from ddprl.config import load_config  # noqa: E402
from ddprl.errors import UsageError  # noqa: E402
from ddprl.metrics import read_metrics  # noqa: E402
from ddprl.runtime import launch  # noqa: E402
from ddprl.runtime.compat import COMPILED_PREFIX  # noqa: E402

TINY = TDMPC2_TINY


def tiny_cfg(*overrides: str, world_size: int = 1):
    return load_config(
        [
            "algo=tdmpc2",
            "task=cartpole-balance",
            f"world_size={world_size}",
            f"num_envs={world_size}",
            "device=cpu",
            "dist_timeout=120",
            "progress=false",
            *TINY,
            *overrides,
        ]
    )


# --------------------------------------------------------------------------- losses (hand-computed)


def test_world_model_loss_terms_by_hand():
    H, B, d, Q = 2, 3, 4, 2
    z = torch.zeros(H + 1, B, d)
    next_z = torch.stack([torch.ones(B, d), 2 * torch.ones(B, d)])  # squared errors 1 (t=0) and 4 (t=1)
    uniform = torch.zeros(H, B, NUM_BINS)  # soft CE of uniform logits = log(101), whatever the target
    perfect = torch.log(two_hot(torch.full((H, B, 1), 3.0)) + 1e-30)  # CE = entropy of the two-hot target
    out = {
        "z": z,
        "next_z": next_z,
        "reward_logits": uniform,
        "q_logits": torch.stack([uniform, perfect]),
        "td_target": torch.full((H, B, 1), 3.0),
    }
    terms = world_model_loss(
        out, reward=torch.zeros(H, B, 1), rho=0.5, consistency_coef=20, reward_coef=0.1, value_coef=0.1
    )
    assert terms["consistency"].item() == pytest.approx((1 * 1 + 0.5 * 4) / H)
    assert terms["reward"].item() == pytest.approx((1 + 0.5) * math.log(NUM_BINS) / H, rel=1e-5)
    t = two_hot(torch.tensor([[3.0]]))[0]
    target_entropy = -(t[t > 0] * t[t > 0].log()).sum().item()
    per_step_value = (math.log(NUM_BINS) + target_entropy) / Q  # members averaged
    assert terms["value"].item() == pytest.approx((1 + 0.5) * per_step_value / H, rel=1e-4)
    expected = 20 * terms["consistency"] + 0.1 * terms["reward"] + 0.1 * terms["value"]
    assert terms["loss"].item() == pytest.approx(expected.item())


def test_world_model_loss_weights_each_step_by_its_own_error_by_hand():
    """Errors that differ from step to step, so that each step's own mean (then rho^t) is checked:
    latents 0.5 and 1 against encodings 1 and 3; reward logits uniform at t=0, the target's own
    two-hot at t=1."""
    H, B, d, Q = 2, 3, 4, 2
    z = torch.stack([torch.zeros(B, d), 0.5 * torch.ones(B, d), torch.ones(B, d)])
    next_z = torch.stack([torch.ones(B, d), 3 * torch.ones(B, d)])  # squared errors 0.25 (t=0) and 4 (t=1)
    uniform = torch.zeros(B, NUM_BINS)
    perfect = torch.log(two_hot(torch.full((B, 1), 3.0)) + 1e-30)
    out = {
        "z": z,
        "next_z": next_z,
        "reward_logits": torch.stack([uniform, perfect]),
        "q_logits": torch.zeros(Q, H, B, NUM_BINS),
        "td_target": torch.full((H, B, 1), 3.0),
    }
    terms = world_model_loss(out, reward=torch.full((H, B, 1), 3.0), rho=0.5)
    t = two_hot(torch.tensor([[3.0]]))[0]
    target_entropy = -(t[t > 0] * t[t > 0].log()).sum().item()
    assert terms["consistency"].item() == pytest.approx((1 * 0.25 + 0.5 * 4) / H)
    assert terms["reward"].item() == pytest.approx((math.log(NUM_BINS) + 0.5 * target_entropy) / H, rel=1e-5)
    assert terms["value"].item() == pytest.approx((1 + 0.5) * math.log(NUM_BINS) / H, rel=1e-5)


def test_policy_loss_by_hand():
    q = torch.tensor([[[2.0], [4.0]], [[6.0], [8.0]]])  # (T=2, B=2, 1)
    ent = torch.tensor([[[1.0], [3.0]], [[5.0], [7.0]]])
    terms = policy_loss(q, ent, scale=torch.tensor([2.0]), rho=0.5, entropy_coef=0.1)
    # step means of entropy_coef * H + Q / scale: t=0: 0.2 + 1.5 = 1.7, t=1: 0.6 + 3.5 = 4.1
    assert terms["loss"].item() == pytest.approx(-(1.0 * 1.7 + 0.5 * 4.1) / 2)
    assert terms["q"].item() == pytest.approx(5.0) and terms["entropy"].item() == pytest.approx(4.0)
    torch.testing.assert_close(rho_weights(3, 0.5, q), torch.tensor([1.0, 0.5, 0.25]))


def test_policy_loss_gradient_reaches_policy_only():
    torch.manual_seed(0)
    model = WorldModel(5, 2, dims=model_dims(tiny_cfg()))
    with torch.no_grad():
        model.qs.weight2.normal_()
    z = model.encode(torch.randn(4, 8, 5)).detach()  # (H+1, B, d)
    action, info = model.policy(z)
    q = model.Q(z, action, "avg", detach=True)
    policy_loss(q, info["scaled_entropy"], torch.ones(1))["loss"].backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.policy.parameters())
    assert all(p.grad is None for n, p in model.named_parameters() if not n.startswith("policy."))


# --------------------------------------------------------------------------- small pieces of the loop


def test_config_defaults_and_checks():
    cfg = load_config(["algo=tdmpc2"])
    assert (cfg.task, cfg.model_size, cfg.batch_size, cfg.horizon, cfg.num_samples, cfg.num_elites) == (
        "walker-run",
        5,
        256,
        3,
        512,
        64,
    )
    assert (cfg.lr, cfg.enc_lr_scale, cfg.grad_clip_norm, cfg.rho, cfg.tau, cfg.entropy_coef) == (
        3e-4,
        0.3,
        20.0,
        0.5,
        0.01,
        1e-4,
    )
    assert model_dims(cfg).latent_dim == 512 and model_dims(tiny_cfg()).latent_dim == 16
    ddp = load_config([], config_name="tdmpc2_ddp")
    assert ddp.algo == "tdmpc2" and ddp.world_size == ddp.num_envs == 8
    for bad, match in [
        ("num_envs=3", "divisible"),
        ("precision=fp16", "bf16"),
        ("latent_dim=12", "multiple of 8"),
        ("num_elites=600", "num_elites"),
        ("model_size=2", "1, 5, 19, 48, 317"),
    ]:
        with pytest.raises(UsageError, match=match):
            load_config(["algo=tdmpc2", "world_size=2", "num_envs=2", bad])  # the later num_envs wins


def test_env_adapter_for_gymnasium_boxes_and_refusals():
    cfg = tiny_cfg("task=Pendulum-v1")  # torque in [-2, 2], 200-step episodes
    env = make_tdmpc2_env(cfg, 1, seed=0, device=torch.device("cpu"))
    assert isinstance(env, UnitBoxActions) and env.single_action_space.high[0] == 1.0
    assert episode_length_of(cfg, env) == 200
    env.reset()
    env.step(torch.ones(1, 1))
    assert env.env.envs.envs[0].unwrapped.last_u == pytest.approx(2.0)  # +1 -> the box's upper bound
    env.step(torch.zeros(1, 1))
    assert env.env.envs.envs[0].unwrapped.last_u == pytest.approx(0.0)
    assert not isinstance(
        make_tdmpc2_env(tiny_cfg("task=HalfCheetah-v5"), 1, 0, torch.device("cpu")), UnitBoxActions
    )  # already [-1, 1]
    with pytest.raises(UsageError, match="continuous actions"):
        make_tdmpc2_env(tiny_cfg("task=CartPole-v1"), 1, 0, torch.device("cpu"))
    assert episode_length_of(tiny_cfg("episode_length=40"), env) == 40


def test_episode_recorder_hands_over_whole_episodes():
    rec = EpisodeRecorder(num_envs=2)
    rec.start(torch.tensor([[0.0], [100.0]]))
    finished = []
    for t in range(1, 6):
        done = torch.tensor([t % 2 == 0, t == 5])  # env 0 ends every 2 steps, env 1 at step 5
        final = torch.tensor([[t + 0.5], [100 + t + 0.5]])
        nxt = torch.tensor([[1000.0 * t if done[0] else t], [100.0 + t]])
        finished += rec.add(
            torch.tensor([[t], [-t]]).float(),
            torch.tensor([t, -t]).float(),
            torch.tensor([False, t == 5]),
            done,
            final,
            nxt,
        )
    assert [e.obs.shape[0] for e in finished] == [3, 3, 6]  # T + 1 observations
    first, second, long = finished
    torch.testing.assert_close(first.obs.flatten(), torch.tensor([0.0, 1.0, 2.5]))  # ends on the true final obs
    torch.testing.assert_close(second.obs.flatten(), torch.tensor([2000.0, 3.0, 4.5]))  # starts on the reset obs
    torch.testing.assert_close(long.actions.flatten(), -torch.arange(1.0, 6.0))
    assert long.terminated.tolist() == [False] * 4 + [True] and not first.terminated.any()


def test_acting_warm_start_is_forgotten_at_episode_end():
    cfg = tiny_cfg()
    learner_model = WorldModel(5, 1, dims=model_dims(cfg))
    acting = Acting(learner_model, cfg, discount=0.99)
    a = acting(torch.randn(2, 5))
    assert a.shape == (2, 1) and a.abs().max() <= 1 and acting.prev_mean.shape == (3, 2, 1)
    acting.prev_mean = torch.ones(3, 2, 1)
    acting.episode_ended(torch.tensor([True, False]))
    torch.testing.assert_close(acting.prev_mean[:, 0], torch.zeros(3, 1))
    torch.testing.assert_close(acting.prev_mean[:, 1], torch.ones(3, 1))
    policy_only = Acting(learner_model, tiny_cfg("mpc=false"), discount=0.99)
    obs = torch.randn(4, 5)
    torch.testing.assert_close(policy_only(obs, eval_mode=True), policy_only(obs, eval_mode=True))  # the mean


# --------------------------------------------------------------------------- distributed equivalences

OBS, ACT, B, H = 5, 2, 16, 3


def _batch_and_noise(seed: int = 0, H: int = H, B: int = B, every: int = 5) -> dict[str, torch.Tensor]:
    """A fixed batch (H steps, B sub-trajectories, every ``every``-th terminated) and its update's noise."""
    g = torch.Generator().manual_seed(seed)
    terminated = torch.zeros(H, B, 1)
    terminated[-1, ::every] = 1.0
    return {
        "obs": torch.randn(H + 1, B, OBS, generator=g),
        "action": torch.rand(H, B, ACT, generator=g) * 2 - 1,
        "reward": torch.rand(H, B, 1, generator=g) * 3,
        "terminated": terminated,
        "eps_td": torch.randn(H, B, ACT, generator=g),
        "eps_pi": torch.randn(H + 1, B, ACT, generator=g),
        "members_td": torch.tensor([2, 0]),
        "members_pi": torch.tensor([1, 2]),
    }


def _state(learner) -> dict[str, torch.Tensor]:
    out = {k: v.detach().clone() for k, v in learner.model.state_dict().items()}  # online, policy, target Qs
    out["scale"] = learner.scale.value.clone()
    return out


def update_on_shares(rt, cfg, out: str, steps: int) -> None:
    """Each rank updates on its contiguous share of the fixed batch (sync_freq micro-batches each)."""
    data = _batch_and_noise()
    k = cfg.sync_freq
    n = B // (rt.world_size * k)
    torch.manual_seed(0)
    learner = build_learner(rt, cfg, OBS, ACT)
    with torch.no_grad():  # Q heads that spread Q values (alike on every rank), so the Q scale moves
        learner.model.qs.weight2.normal_(generator=torch.Generator().manual_seed(0))
    learner.model.make_target()
    before = _state(learner)
    metrics = []
    for _ in range(steps):
        batches, noises = [], []
        for j in range(k):
            rows = slice((rt.rank * k + j) * n, (rt.rank * k + j + 1) * n)
            batches.append(
                TrajectoryBatch(
                    data["obs"][:, rows], data["action"][:, rows], data["reward"][:, rows], data["terminated"][:, rows]
                )
            )
            noises.append(
                UpdateNoise(data["members_td"], data["members_pi"], data["eps_td"][:, rows], data["eps_pi"][:, rows])
            )
        values = update(rt, learner, batches, noises, cfg, discount=0.99)
        metrics.append(dict(zip(learner.names, values.tolist(), strict=True)))
    torch.save({"before": before, "after": _state(learner), "metrics": metrics}, Path(out) / f"rank{rt.rank}.pt")


def _run_shares(tmp_path: Path, world_size: int, sync_freq: int, steps: int = 2):
    cfg = tiny_cfg(
        "dropout=0", f"sync_freq={sync_freq}", f"batch_size={B // (world_size * sync_freq)}", world_size=world_size
    )
    out = tmp_path / f"w{world_size}-k{sync_freq}"
    out.mkdir()
    launch(functools.partial(update_on_shares, out=str(out), steps=steps), cfg)
    return [torch.load(out / f"rank{r}.pt") for r in range(world_size)]


def _assert_close_states(a: dict, b: dict, atol: float) -> None:
    assert a.keys() == b.keys()
    for key in a:
        # The scale (~7 here) is a float32 percentile of Qs near +-50: compared relatively.
        rtol = 1e-5 if key == "scale" and atol > 0 else 0.0
        assert torch.allclose(a[key], b[key], atol=atol, rtol=rtol), (key, (a[key] - b[key]).abs().max())


def test_two_ranks_on_half_batches_equal_one_process_on_the_full_batch(tmp_path):
    single = _run_shares(tmp_path, world_size=1, sync_freq=1)
    ddp = _run_shares(tmp_path, world_size=2, sync_freq=1)
    accumulated = _run_shares(tmp_path, world_size=2, sync_freq=2)  # 2 ranks x 2 micro-batches of B/4
    # the averaged gradients themselves (norms before the clip), where Adam would hide a constant factor
    for name in ("train/grad_norm", "train/pi_grad_norm"):
        norms = [m[name] for m in single[0]["metrics"]]
        assert min(norms) > 1e-3, name
        for r in [*ddp, *accumulated]:
            assert [m[name] for m in r["metrics"]] == pytest.approx(norms, rel=1e-4), name
    _assert_close_states(single[0]["after"], ddp[0]["after"], atol=1e-5)
    _assert_close_states(single[0]["after"], accumulated[0]["after"], atol=1e-5)
    _assert_close_states(ddp[0]["after"], ddp[1]["after"], atol=0)
    _assert_close_states(accumulated[0]["after"], accumulated[1]["after"], atol=0)
    # the Q scale left its clamp at 1: its statistic over the gathered batch is what is compared
    assert single[0]["after"]["scale"].item() > 1.01
    # the update really moved world model, policy and targets (two no-ops would be equal too)
    moved = {k: (single[0]["after"][k] - single[0]["before"][k]).abs().max().item() for k in single[0]["after"]}
    for prefix, least in [
        ("encoder.", 1e-4),
        ("dynamics.", 1e-4),
        ("reward_head.", 1e-4),
        ("qs.", 1e-4),
        ("policy.", 1e-4),
        ("target_qs.", 1e-6),
    ]:  # targets move by tau = 0.01 of that
        assert max(v for k, v in moved.items() if k.startswith(prefix)) > least, prefix


class OneProcess:
    """The runtime a learner sees in a job of one process: its collectives hand back their input."""

    world_size, rank, device = 1, 0, torch.device("cpu")

    def broadcast_module(self, module):
        pass

    def region_mean(self, tensor):
        return tensor

    def region_all_gather(self, tensor):
        return tensor


def _fixed_update(learner, cfg, data=None):
    data = data or _batch_and_noise()
    batch = TrajectoryBatch(data["obs"], data["action"], data["reward"], data["terminated"])
    noise = UpdateNoise(data["members_td"], data["members_pi"], data["eps_td"], data["eps_pi"])
    values = update(OneProcess(), learner, [batch], [noise], cfg, discount=0.99)
    return dict(zip(learner.names, values.tolist(), strict=True))


def _learner_with_spread_qs(cfg):
    """A one-process learner whose Q heads spread their values (the initial last layer is zero), so
    that the Q scale and the TD targets move; its targets copied from them."""
    torch.manual_seed(0)
    learner = build_learner(OneProcess(), cfg, OBS, ACT)
    with torch.no_grad():
        learner.model.qs.weight2.normal_(generator=torch.Generator().manual_seed(0))
    learner.model.make_target()
    return learner


def test_a_fresh_learner_starts_its_target_qs_as_its_online_qs():
    torch.manual_seed(0)
    learner = build_learner(OneProcess(), tiny_cfg("dropout=0"), OBS, ACT)
    for t, q in zip(learner.model.target_qs.tensors(), learner.model.qs.tensors(), strict=True):
        assert torch.equal(t, q)


def test_a_learner_built_from_a_saved_state_goes_on_as_the_saved_one():
    """Weights, targets, both optimizers' moments and the Q scale come back: the next update of the
    rebuilt learner equals the next update of the one that was saved."""
    cfg = tiny_cfg("dropout=0")
    first = _learner_with_spread_qs(cfg)
    _fixed_update(first, cfg)
    saved = first.state_dict()
    torch.manual_seed(1)  # other initial weights: everything must come from the state
    second = build_learner(OneProcess(), cfg, OBS, ACT, state=saved)
    assert second.scale.value.item() == first.scale.value.item() != 1.0
    _fixed_update(first, cfg)
    _fixed_update(second, cfg)
    a, b = first.model.state_dict(), second.model.state_dict()
    for key in a:
        assert torch.equal(a[key], b[key]), key
    assert torch.equal(first.scale.value, second.scale.value)


def test_an_update_reports_its_terms_and_scales_by_the_qs_at_the_first_latents(monkeypatch):
    """The loss reported is the weighted sum of the terms reported; the Q scale takes one EMA step
    towards the 5-95 % range of Q(z_0, pi(z_0)), z_0 the encoded first observations (before the step)."""
    import copy

    cfg = tiny_cfg("dropout=0")
    learner = _learner_with_spread_qs(cfg)
    data = _batch_and_noise()
    before = copy.deepcopy(learner.model)
    seen = []
    scale_update = learner.scale.update
    monkeypatch.setattr(learner.scale, "update", lambda x: (seen.append(x.clone()), scale_update(x)))
    metrics = _fixed_update(learner, cfg, data)
    weighted = cfg.consistency_coef * metrics["train/consistency"] + cfg.reward_coef * metrics["train/reward"]
    assert metrics["train/loss"] == pytest.approx(weighted + cfg.value_coef * metrics["train/value"], rel=1e-5)
    assert metrics["train/consistency"] > 0 and metrics["train/reward"] > 0 and metrics["train/value"] > 0
    with torch.no_grad():
        z0 = before.encode(data["obs"][0])
        action = before.policy(z0, data["eps_pi"][0])[0]  # the policy before its own step
        expected = learner.model.Q(z0, action, "avg", members=data["members_pi"]).flatten()  # Qs after theirs
    assert len(seen) == 1
    torch.testing.assert_close(seen[0], expected)


def sync_after_updates(rt, cfg, out: str, updates: int) -> None:
    """Per-rank init, data, policy noise and dropout; only what must be shared is shared."""
    torch.manual_seed(100 + rt.rank)  # a different initialisation on each rank: DDP must broadcast rank 0's
    learner = build_learner(rt, cfg, OBS, ACT)
    model = learner.model
    result = {
        "online_q_at_start": [t.clone() for t in model.qs.tensors()],
        "target_q_at_start": [t.clone() for t in model.target_qs.tensors()],
    }
    with torch.no_grad():  # Q heads that spread Q values (identical on every rank), so the scale leaves 1
        model.qs.weight2.normal_(generator=torch.Generator().manual_seed(0))
    model.make_target()
    shared = torch.Generator().manual_seed(rt.seeds(cfg.seed).shared())
    data = _batch_and_noise(seed=10 + rt.rank)  # each rank its own experience
    batch = TrajectoryBatch(data["obs"], data["action"], data["reward"] * 50, data["terminated"])
    local_ranges = []
    for _ in range(updates):
        with torch.no_grad():
            z = model.encode(batch.obs)
            local_ranges.append(RunningScale().percentile_range(model.Q(z, model.policy(z)[0], "avg")[0]))
        update(rt, learner, [batch], [draw_noise(shared, model.num_q, rt.device)], cfg, discount=0.99)
    result.update(after=_state(learner), local_ranges=torch.cat(local_ranges))
    torch.save(result, Path(out) / f"rank{rt.rank}.pt")


def test_targets_and_scale_identical_on_all_ranks_after_updates(tmp_path):
    cfg = tiny_cfg(world_size=2)  # dropout 0.01 on: every rank draws its own masks
    launch(functools.partial(sync_after_updates, out=str(tmp_path), updates=4), cfg)
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt") for r in range(2))
    for t0, t1, q0 in zip(r0["target_q_at_start"], r1["target_q_at_start"], r0["online_q_at_start"], strict=True):
        torch.testing.assert_close(t0, t1, atol=0, rtol=0)  # targets made after DDP's broadcast
        torch.testing.assert_close(t0, q0, atol=0, rtol=0)
    _assert_close_states(r0["after"], r1["after"], atol=0)  # params, target Qs and the scale
    assert r0["after"]["scale"].item() > 1.01  # the scale really moved...
    assert not torch.allclose(r0["local_ranges"], r1["local_ranges"])  # ...on statistics that differ per rank


# --------------------------------------------------------------------------- end to end (the real CLI)

E2E = [
    "algo=tdmpc2",
    "task=cartpole-balance",
    *TINY,
    "world_size=2",
    "num_envs=2",
    "episode_length=50",
    "seed_steps=200",
    "log_freq=100",
    "eval_freq=0",
    "eval_episodes=2",
    "checkpoint_freq=200",
    "progress=false",
    "dist_timeout=120",
    "device=cpu",
]


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("e2e") / "run"
    proc = run_cli(["train", *E2E, "steps=300", "checkpoint_buffer=true", f"run_dir={run_dir}"], timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return run_dir, proc


@pytest.mark.slow
def test_end_to_end_two_ranks_writes_the_run_directory(trained_run):
    run_dir, proc = trained_run
    assert f"run directory: {run_dir}" in proc.stdout
    assert (run_dir / "config.yaml").is_file() and any((run_dir / "tb").iterdir())
    assert {p.name for p in (run_dir / "checkpoints").iterdir()} == {
        "step_200.pt",
        "step_300.pt",
        "latest.pt",
        "best.pt",
        "buffers",
    }
    assert {p.name for p in (run_dir / "checkpoints" / "buffers").iterdir()} == {"rank0.pt", "rank1.pt"}
    records = read_metrics(run_dir)
    assert [r["step"] for r in records] == [100, 200, 300]
    last = records[-1]
    # seed steps 200 global = 100 per rank: the 100-update burst, then 1 per agent step per rank
    assert last["train/updates"] == 100 + 50
    assert last["train/effective_batch_size"] == 16 * 2
    assert last["eval/episodes"] == 2 and last["eval/length_mean"] == 50
    assert all(math.isfinite(last[k]) for k in ("train/loss", "train/pi_loss", "train/value", "time/global_fps"))
    ckpt = load_checkpoint(run_dir / "checkpoints" / "latest.pt")
    assert (
        ckpt["world_size"] == 2
        and ckpt["step"] == 300
        and ckpt["counters"]["updates"] == 150
        and len(ckpt["ranks"]) == 2
    )
    assert not any(k.startswith(("module.", COMPILED_PREFIX)) for k in ckpt["state"]["model"])
    assert any(k.startswith("target_qs.") for k in ckpt["state"]["model"])


@pytest.mark.slow
def test_two_rank_checkpoint_evaluates_in_one_process(trained_run):
    run_dir, _ = trained_run
    proc = run_cli(
        ["eval", f"checkpoint={run_dir / 'checkpoints' / 'latest.pt'}", "episodes=3", "device=cpu"], timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "episodes=3" in proc.stdout and "return_mean=" in proc.stdout
    assert "return_min=" in proc.stdout and "return_max=" in proc.stdout
    noisy = run_cli(
        ["eval", f"checkpoint={run_dir / 'checkpoints' / 'latest.pt'}", "deterministic=false", "episodes=1"],
        timeout=300,
    )
    assert noisy.returncode == 0 and "episodes=1" in noisy.stdout, noisy.stderr[-3000:]
    ckpt = load_checkpoint(run_dir / "checkpoints" / "latest.pt")
    saved = {k: v for k, v in ckpt["config"].items() if k not in ("run_dir", "resume", "master_port")}
    actor = load_actor(load_config(["world_size=1", "num_envs=1"], resumed=saved), ckpt["state"], torch.device("cpu"))
    env = actor.make_env(2, 0)
    actions = actor.act(env.reset())
    assert actions.shape == (2, 1) and actions.abs().max() <= 1
    # The same plan's random numbers with and without training's exploration noise on top
    # (8 envs: an action clamped at a bound either way can match, all 8 will not).
    noisy_cfg = load_config(["world_size=1", "num_envs=1", "eval_deterministic=false"], resumed=saved)
    noisy_actor = load_actor(noisy_cfg, ckpt["state"], torch.device("cpu"))
    env8 = actor.make_env(8, 0)
    torch.manual_seed(0)
    planned = actor.act(env8.reset())  # eval mode: MPPI without exploration noise, warm start reset
    torch.manual_seed(0)
    explored = noisy_actor.act(env8.reset())
    assert explored.shape == (8, 1) and explored.abs().max() <= 1
    assert not torch.equal(planned, explored)


@pytest.mark.slow
def test_resume_continues_the_run(trained_run, tmp_path):
    run_dir, _ = trained_run
    import shutil

    resumed_dir = tmp_path / "resumed"
    shutil.copytree(run_dir, resumed_dir)
    shutil.rmtree(resumed_dir / "checkpoints" / "buffers")  # as if checkpoint_buffer had been false
    proc = run_cli(["train", *E2E, "steps=600", "resume=auto", f"run_dir={resumed_dir}"], timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "resumed at step 300 after 150 updates; refilling" in proc.stderr
    records = read_metrics(resumed_dir)
    assert [r["step"] for r in records] == [100, 200, 300, 400, 500, 600]  # one file, continued
    by_step = {r["step"]: r for r in records}
    # no buffers saved: refilled for seed_steps (200 global) steps, then 1 update per agent step
    assert by_step[400]["train/updates"] == by_step[500]["train/updates"] == 150
    assert by_step[600]["train/updates"] == 150 + 50
    ckpt = load_checkpoint(resumed_dir / "checkpoints" / "latest.pt")
    assert ckpt["step"] == 600 and ckpt["counters"]["updates"] == 200
    # an architecture change is refused before any process starts
    bad = run_cli(["train", *E2E, "steps=700", "resume=auto", f"run_dir={resumed_dir}", "mlp_dim=64"], timeout=120)
    assert bad.returncode == 2 and "mlp_dim" in bad.stderr


@pytest.mark.slow
def test_resume_with_checkpointed_buffers_goes_on_updating(trained_run, tmp_path):
    run_dir, _ = trained_run
    import shutil

    saved = torch.load(run_dir / "checkpoints" / "buffers" / "rank1.pt", weights_only=True)
    assert saved["step"] == 300 and len(saved["buffer"]["episodes"]) == 3  # 150 agent steps = 3 episodes of 50
    resumed_dir = tmp_path / "resumed"
    shutil.copytree(run_dir, resumed_dir)
    proc = run_cli(["train", *E2E, "steps=400", "resume=auto", f"run_dir={resumed_dir}"], timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "resumed at step 300 after 150 updates with the replay buffers (150 transitions on rank 0)" in proc.stderr
    by_step = {r["step"]: r for r in read_metrics(resumed_dir)}
    assert by_step[400]["train/updates"] == 150 + 50  # no refill: one update per agent step at once
    assert torch.load(resumed_dir / "checkpoints" / "buffers" / "rank0.pt", weights_only=True)["step"] == 400
    # a buffer saved at another step than the checkpoint's is not used
    stale = tmp_path / "stale"
    shutil.copytree(run_dir, stale)
    shutil.copyfile(stale / "checkpoints" / "step_200.pt", stale / "checkpoints" / "latest.pt")
    proc = run_cli(["train", *E2E, "steps=300", "resume=auto", f"run_dir={stale}"], timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "is from step 300, the checkpoint from step 200: not restored" in proc.stderr
    assert "refilling the replay buffers" in proc.stderr


@pytest.mark.slow
def test_two_rank_run_resumes_on_one_rank(trained_run, tmp_path):
    run_dir, _ = trained_run
    import shutil

    resumed_dir = tmp_path / "one"
    shutil.copytree(run_dir, resumed_dir)
    proc = run_cli(
        ["train", *E2E, "world_size=1", "num_envs=1", "steps=400", "resume=auto", f"run_dir={resumed_dir}"], timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    # the two ranks' replays pooled into the one: updates go on at once, one per transition collected
    assert "replay re-sharded: the" in proc.stderr and "over 1 rank(s)" in proc.stderr
    assert "resumed at step 300 after 150 updates with the replay buffers" in proc.stderr
    ckpt = load_checkpoint(resumed_dir / "checkpoints" / "latest.pt")
    assert ckpt["world_size"] == 1 and ckpt["step"] == 400 and ckpt["counters"]["updates"] == 150 + 100


def test_buffer_state_dict_round_trip():
    from ddprl.algos.tdmpc2.buffer import EpisodeBuffer

    buf = EpisodeBuffer(capacity=30, obs_dim=2, action_dim=1)
    g = torch.Generator().manual_seed(0)
    for T in (8, 9, 7, 10):  # the fourth episode wraps to row 0 and evicts the two it overlaps
        buf.add_episode(
            torch.randn(T + 1, 2, generator=g),
            torch.rand(T, 1, generator=g),
            torch.randn(T, generator=g),
            torch.zeros(T),
        )
    other = EpisodeBuffer(capacity=30, obs_dim=2, action_dim=1)
    other.load_state_dict(buf.state_dict())
    assert len(other) == len(buf) == 17 and other.num_episodes == buf.num_episodes == 2
    a = buf.sample(64, 3, generator=torch.Generator().manual_seed(1))
    b = other.sample(64, 3, generator=torch.Generator().manual_seed(1))
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    with pytest.raises(ValueError, match="does not fit"):
        EpisodeBuffer(capacity=30, obs_dim=3, action_dim=1).load_state_dict(buf.state_dict())


def test_discrete_task_is_refused_before_a_run_directory_exists(tmp_path):
    proc = run_cli(
        [
            "train",
            "algo=tdmpc2",
            "task=CartPole-v1",
            "world_size=1",
            "num_envs=1",
            "device=cpu",
            f"run_dir={tmp_path / 'never'}",
        ],
        timeout=120,
    )
    assert proc.returncode == 2
    assert "ddprl: error: tdmpc2 needs continuous actions" in proc.stderr and "algo=ppo" in proc.stderr
    assert not (tmp_path / "never").exists()


@pytest.mark.slow
def test_run_ddp_script_launches_torchrun(tmp_path):
    import subprocess
    import sys

    from conftest import REPO, cli_env

    run_dir = tmp_path / "torchrun"
    cmd = [
        "bash",
        str(REPO / "scripts" / "run_ddp.sh"),
        "cartpole-balance",
        "1",
        "2",
        "1",
        *TINY,
        "compile=false",
        "device=cpu",
        "episode_length=20",
        "seed_steps=40",
        "steps=60",
        "eval_episodes=2",
        "log_freq=20",
        "checkpoint_freq=0",
        "progress=false",
        "dist_timeout=120",
        f"run_dir={run_dir}",
    ]
    env = {**cli_env(), "PYTHON": sys.executable, "MUJOCO_GL": "disable", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = read_metrics(run_dir)
    assert records[-1]["step"] == 60 and records[-1]["train/updates"] == 20 + 10
    cfg = load_checkpoint(run_dir / "checkpoints" / "latest.pt")["config"]
    assert cfg["world_size"] == 2 and cfg["algo"] == "tdmpc2" and cfg["batch_size"] == 16
    bad = subprocess.run(
        ["bash", str(REPO / "scripts" / "run_ddp.sh"), "walker-run"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert bad.returncode == 2 and "TASK MODEL_SIZE" in bad.stdout


@pytest.mark.slow
@pytest.mark.skipif(training_step_unsupported() is not None, reason=str(training_step_unsupported()))
def test_compile_and_bf16_train_end_to_end(tmp_path):
    # the update one compiled region, the act three (tests/test_tdmpc2_regions.py); bf16 autocast
    # updates. num_q=2 as in model_size 1 (WorldModel.Q then draws no members: see there);
    # horizon 2, 1 MPPI iteration: the graphs unroll the horizon, and compile time on 2 cores grows with it.
    run_dir = tmp_path / "compiled"
    proc = run_cli(
        [
            "train",
            "algo=tdmpc2",
            "task=cartpole-balance",
            *TINY,
            "num_q=2",
            "horizon=2",
            "iterations=1",
            "world_size=1",
            "num_envs=1",
            "compile=true",
            "precision=bf16",
            "episode_length=20",
            "seed_steps=40",
            "steps=60",
            "eval_episodes=1",
            "log_freq=20",
            "checkpoint_freq=0",
            "progress=false",
            "device=cpu",
            f"run_dir={run_dir}",
        ],
        timeout=800,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "runs eagerly" not in proc.stderr, proc.stderr[-3000:]  # every region ran compiled to the end
    last = read_metrics(run_dir)[-1]
    assert last["train/updates"] == 40 + 20 and math.isfinite(last["train/loss"]) and "eval/return_mean" in last
    state = load_checkpoint(run_dir / "checkpoints" / "latest.pt")["state"]["model"]
    assert not any(COMPILED_PREFIX in k or k.startswith("module.") for k in state)


# Random actions on Pendulum-v1 (torque uniform in [-2, 2]) score -1234 +- 286 per episode, and
# zero torque -1236 +- 338 (40 episodes each, measured with run_episodes on this machine); a
# mean over 10 episodes of random play has a std of ~90. This run (4000 agent steps: 1000 random,
# the 1000-update burst, 3000 planned) scored -160, -276, -281 with seeds 1, 2, 3, and -192, -391,
# -304 with Mish as x * tanh(softplus(x)) on the CPU (networks.mish, equal to within 1e-6: the runs
# part after the first few updates, as runs do), and -122, -521, -698 with Mish from one exp (an
# AMD EPYC, 2026-11-28; the earlier ones on an Intel Xeon); at 2500 steps returns were still unstable (-468,
# -650, -953 over 5 episodes), hence the budget. ~2.5 min on 2 cores.
# Broken variants (seed 1, AMD EPYC): with the planner's terminal value dropped (a trajectory valued
# by its rewards alone) it scored -1151, near random, below the threshold -800, which sits between
# that and the correct runs' worst (-698). With the discount dropped from the TD target (r + q for
# r + 0.99 q) it scored -141, a pass. Pendulum's 200-step episodes leave the greedy ranking
# of actions nearly unchanged, so only the hand-computed TD target of test_tdmpc2_pieces.py
# (test_td_target_is_reward_plus_discounted_min_of_the_two_target_qs_by_hand) catches that bug.
PENDULUM_RANDOM_RETURN = -1234.0
PENDULUM_THRESHOLD = -800.0


@pytest.mark.slow
def test_learns_pendulum_above_random(tmp_path):
    run_dir = tmp_path / "learn"
    proc = run_cli(
        [
            "train",
            "algo=tdmpc2",
            "task=Pendulum-v1",
            "model_size=1",
            "enc_dim=64",
            "mlp_dim=64",
            "latent_dim=32",
            "batch_size=64",
            "num_samples=64",
            "num_elites=8",
            "num_pi_trajs=8",
            "iterations=3",
            "steps=4000",
            "eval_freq=0",
            "eval_episodes=10",
            "checkpoint_freq=0",
            "log_freq=500",
            "world_size=1",
            "num_envs=1",
            "device=cpu",
            "progress=false",
            "seed=1",
            f"run_dir={run_dir}",
        ],
        timeout=800,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    final = read_metrics(run_dir)[-1]
    assert final["step"] == 4000 and final["eval/episodes"] == 10
    assert final["eval/return_mean"] > PENDULUM_THRESHOLD > PENDULUM_RANDOM_RETURN, final["eval/return_mean"]


def update_without_host_sync(rt, cfg, out: str) -> None:
    learner = build_learner(rt, cfg, OBS, ACT)
    data = _batch_and_noise()
    batch = TrajectoryBatch(data["obs"], data["action"], data["reward"], data["terminated"]).to(rt.device)
    shared = torch.Generator(device=rt.device).manual_seed(0)
    for _ in range(2):  # warm-up: lazy CUDA initialisation may synchronise once
        update(rt, learner, [batch], [draw_noise(shared, learner.model.num_q, rt.device)], cfg, 0.99)
    torch.cuda.set_sync_debug_mode("error")  # any blocking host<->device sync now raises
    try:
        update(rt, learner, [batch], [draw_noise(shared, learner.model.num_q, rt.device)], cfg, 0.99)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.save({"ok": True}, Path(out) / "rank0.pt")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_update_makes_no_host_device_sync_on_cuda(tmp_path):
    cfg = load_config(
        [
            "algo=tdmpc2",
            "task=cartpole-balance",
            "world_size=1",
            "num_envs=1",
            "device=cuda",
            "dist_timeout=120",
            "progress=false",
            *TINY,
        ]
    )
    launch(functools.partial(update_without_host_sync, out=str(tmp_path)), cfg)
    assert torch.load(tmp_path / "rank0.pt")["ok"]
