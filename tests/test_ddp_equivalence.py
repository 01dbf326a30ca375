"""DDP equivalences (docs/distributed.md, invariants 1, 2, 5) on real gloo process groups, 2 ranks."""

from __future__ import annotations

import functools
from pathlib import Path

import dist_fns
import pytest
import torch

from ddprl.config import load_config
from ddprl.runtime import launch

N = 64  # samples in the whole batch


@pytest.fixture(scope="module")
def batch_path(tmp_path_factory):
    g = torch.Generator().manual_seed(7)
    batch = {
        "obs": torch.randn(N, 4, generator=g),
        "actions": torch.randint(0, 2, (N,), generator=g),
        "log_probs": torch.full((N,), -0.69) + 0.05 * torch.randn(N, generator=g),
        "values": torch.randn(N, generator=g),
        "advantages": torch.randn(N, generator=g),
        "returns": torch.randn(N, generator=g),
    }
    path = tmp_path_factory.mktemp("batch") / "batch.pt"
    torch.save(batch, path)
    return str(path)


def run_learn(
    tmp_path,
    batch_path,
    world_size,
    batch_size,
    sync_freq=1,
    epochs=1,
    steps=1,
    max_grad_norm=0.0,
    target_kl=None,
    per_rank=False,
    norm_adv=True,
):
    """``learn`` on ``world_size`` ranks; each rank's record of ``dist_fns.ppo_learn``.

    ``per_rank``: ``batch_path`` holds one batch per rank instead of one batch to split.
    ``norm_adv``: true (the default) and false both leave the batch's advantages as they are
    (true normalises the rollout before ``learn``); minibatch normalises them in ``learn``.
    """
    cfg = load_config(
        [
            f"world_size={world_size}",
            f"num_envs={world_size * 2}",
            f"batch_size={batch_size}",
            f"sync_freq={sync_freq}",
            f"epochs={epochs}",
            "n_steps=64",
            "dist_timeout=60",
            f"max_grad_norm={max_grad_norm}",
            f"target_kl={'null' if target_kl is None else target_kl}",
            f"norm_adv={str(norm_adv).lower()}",
        ]
    )
    name = f"w{world_size}-b{batch_size}-s{sync_freq}-e{epochs}-n{steps}"
    name += (f"-g{max_grad_norm}" if max_grad_norm else "") + (f"-k{target_kl}" if target_kl is not None else "")
    name += f"-a{norm_adv}-{Path(batch_path).stem}"
    out = tmp_path / (name + ("-p" if per_rank else ""))
    out.mkdir()
    launch(
        functools.partial(dist_fns.ppo_learn, out=str(out), batch_path=batch_path, steps=steps, per_rank=per_rank), cfg
    )
    return [torch.load(out / f"rank{r}.pt") for r in range(world_size)]


def assert_same_params(a, b, atol):
    assert a.keys() == b.keys()
    for k in a:
        assert torch.allclose(a[k], b[k], atol=atol), (k, (a[k] - b[k]).abs().max())


@pytest.mark.slow
def test_two_half_batches_equal_one_full_batch(tmp_path, batch_path):
    single = run_learn(tmp_path, batch_path, world_size=1, batch_size=N)
    ddp = run_learn(tmp_path, batch_path, world_size=2, batch_size=N // 2)
    assert_same_params(single[0]["params"], ddp[0]["params"], atol=1e-6)
    assert_same_params(ddp[0]["params"], ddp[1]["params"], atol=0)
    # and the update really moved the weights (an equivalence of two no-ops proves nothing)
    untouched = run_learn(tmp_path, batch_path, world_size=1, batch_size=N, epochs=1, steps=0)
    diff = max((single[0]["params"][k] - untouched[0]["params"][k]).abs().max() for k in untouched[0]["params"])
    assert diff > 1e-3


@pytest.mark.slow
def test_sync_freq_accumulates_like_one_big_batch(tmp_path, batch_path):
    single = run_learn(tmp_path, batch_path, world_size=1, batch_size=N)
    accumulated = run_learn(tmp_path, batch_path, world_size=1, batch_size=N // 2, sync_freq=2)
    assert_same_params(single[0]["params"], accumulated[0]["params"], atol=1e-6)
    ddp_accumulated = run_learn(tmp_path, batch_path, world_size=2, batch_size=N // 4, sync_freq=2)
    assert_same_params(single[0]["params"], ddp_accumulated[0]["params"], atol=1e-6)


@pytest.mark.slow
def test_ranks_identical_after_many_updates(tmp_path, batch_path):
    ranks = run_learn(tmp_path, batch_path, world_size=2, batch_size=8, epochs=3, steps=3)
    assert ranks[0]["checksums"][0] == ranks[0]["checksums"][1]
    assert_same_params(ranks[0]["params"], ranks[1]["params"], atol=0)


# -- norm_adv=minibatch: each optimizer step's global batch standardised ------------------------------


@pytest.fixture(scope="module")
def standardized_batch_path(batch_path):
    """``batch_path``'s batch with its advantages standardised over all N samples (population std)."""
    batch = torch.load(batch_path)
    a = batch["advantages"]
    batch["advantages"] = (a - a.mean()) / (a.std(correction=0) + 1e-8)
    path = Path(batch_path).with_name("standardized.pt")
    torch.save(batch, path)
    return str(path)


@pytest.mark.slow
def test_minibatch_advantage_norm_uses_the_global_batch(tmp_path, batch_path, standardized_batch_path):
    """One optimizer step over the whole batch, its advantages standardised in ``learn``, equals
    the plain update on advantages standardised beforehand: on one rank, on 2 ranks of half
    batches (the statistics are global, not each rank's) and with sync_freq=2 (those of the
    step's accumulated minibatches together, not of each)."""
    reference = run_learn(tmp_path, standardized_batch_path, world_size=1, batch_size=N, norm_adv=False)
    for world_size, batch_size, sync_freq in [(1, N, 1), (2, N // 2, 1), (2, N // 4, 2)]:
        ranks = run_learn(tmp_path, batch_path, world_size, batch_size, sync_freq=sync_freq, norm_adv="minibatch")
        for r in ranks:
            assert_same_params(reference[0]["params"], r["params"], atol=1e-6)
    # the batch's own advantages are far from standardised: without the normalisation the update differs
    raw = run_learn(tmp_path, batch_path, world_size=1, batch_size=N, norm_adv=False)
    diff = max((raw[0]["params"][k] - reference[0]["params"][k]).abs().max() for k in raw[0]["params"])
    assert diff > 1e-4, diff
    # two steps of N/2: each standardised with its own statistics, not the whole batch's
    halves = run_learn(tmp_path, batch_path, world_size=1, batch_size=N // 2, norm_adv="minibatch")
    whole_stats = run_learn(tmp_path, standardized_batch_path, world_size=1, batch_size=N // 2, norm_adv=False)
    diff = max((halves[0]["params"][k] - whole_stats[0]["params"][k]).abs().max() for k in halves[0]["params"])
    assert diff > 1e-5, diff


# -- KL early stop: decided on the KL averaged over ranks ------------------------------------------


@pytest.fixture(scope="module")
def split_kl_batches(tmp_path_factory):
    """One batch per rank whose local approx KLs are far apart.

    Rank 0's old log-probs are -5.0 where the fresh policy (2 actions, logits ~0) gives about
    -0.69: ratio ~ e^4.3, approx KL ~ 68. Rank 1's are the fresh policy's own log-probs (same
    init seed as in the ranks), so its KL starts at 0 and stays ~1e-3 in the first epoch. The
    KL averaged over ranks is then ~34: between the two local values.
    """
    g = torch.Generator().manual_seed(11)
    n = N // 2
    with torch.random.fork_rng():
        agent = dist_fns.make_agent()
    batches = []
    for rank in range(2):
        obs, actions = torch.randn(n, 4, generator=g), torch.randint(0, 2, (n,), generator=g)
        with torch.no_grad():
            current = agent(obs, actions).log_prob
        batches.append(
            {
                "obs": obs,
                "actions": actions,
                "log_probs": torch.full((n,), -5.0) if rank == 0 else current.clone(),
                "values": torch.randn(n, generator=g),
                "advantages": torch.randn(n, generator=g),
                "returns": torch.randn(n, generator=g),
            }
        )
    path = tmp_path_factory.mktemp("kl") / "batches.pt"
    torch.save(batches, path)
    return str(path)


@pytest.mark.parametrize(
    "target_kl, expected_epochs",
    [
        (10.0, 1),  # global ~34 > 10: stop after epoch 1; rank 1's local ~1e-3 alone would go on
        (50.0, 4),  # global ~34 < 50: all 4 epochs; rank 0's local ~68 alone would stop after 1
    ],
    ids=["global-stops", "global-continues"],
)
def test_target_kl_global_decision_no_deadlock(tmp_path, split_kl_batches, target_kl, expected_epochs):
    """Ranks whose local KLs disagree about ``target_kl`` still run the same epochs, in step.

    Were the decision taken on each rank's own KL (``if local_kl > target_kl: break``), one
    rank would leave the epoch loop after epoch 1 and enter learn's final metrics all-reduce
    while the other runs epoch 2, whose backward waits in DDP's gradient all-reduce: the
    collectives no longer match, so the job fails (a gloo error, or a hang ended by
    dist_timeout=60 -> RankFailed), or at best the ranks report different ``train/epochs``,
    optimizer step counts and parameters. Checked against a copy of loop.py deciding on the
    local KL (with and without still all-reducing it): both cases fail in ~4 s with RankFailed
    "rank 0 exited with code -6" (gloo EnforceNotMet: "Received data size doesn't match
    expected size. Is there a distributed collective mismatch in your code?").
    """
    epochs, batch_size = 4, 8
    ranks = run_learn(
        tmp_path,
        split_kl_batches,
        world_size=2,
        batch_size=batch_size,
        epochs=epochs,
        target_kl=target_kl,
        per_rank=True,
    )
    (local0, global_kl), (local1, global_kl1) = ranks[0]["kl_decisions"][0], ranks[1]["kl_decisions"][0]
    # the set-up really splits the ranks: their own KLs of epoch 1 lie on both sides of target_kl
    assert local0 > target_kl > local1, (local0, local1, target_kl)
    assert global_kl == global_kl1 == pytest.approx((local0 + local1) / 2)
    # the epochs the global KL decides: stop at the first epoch whose global KL exceeds target_kl
    globals_seen = [g for _, g in ranks[0]["kl_decisions"]]
    predicted = next((e + 1 for e, g in enumerate(globals_seen) if g > target_kl), epochs)
    assert predicted == expected_epochs
    assert len(ranks[0]["kl_decisions"]) == len(ranks[1]["kl_decisions"]) == predicted
    for r in ranks:
        assert r["metrics"][0]["train/epochs"] == predicted
        assert r["optimizer_steps"] == predicted * (N // 2 // batch_size)
    assert ranks[0]["checksums"][0] == ranks[0]["checksums"][1]
    assert_same_params(ranks[0]["params"], ranks[1]["params"], atol=0)


def whole_batch_loss(batch_path):
    """One process's PPO loss terms on the whole batch, from the agent every rank starts from (default
    keys), its gradients taken: what learn's first step must reproduce, computed without learn."""
    from ddprl.algos.ppo.loss import ppo_loss

    cfg = load_config([])
    data = torch.load(batch_path)
    with torch.random.fork_rng():
        agent = dist_fns.make_agent()
    terms = ppo_loss(
        agent(data["obs"], data["actions"]),
        data["log_probs"],
        data["values"],
        data["advantages"],
        data["returns"],
        cfg.clip_coef,
        cfg.clip_vloss,
        cfg.vf_coef,
        cfg.ent_coef,
    )
    terms["loss"].backward()
    return agent, terms


# -- gradient clipping: the norm of the all-reduced gradient -----------------------------------------


def test_grad_clipping_under_ddp_equals_one_process(tmp_path, batch_path):
    """``max_grad_norm`` clips the global (all-reduced) gradient, as one process on the full batch does.

    Three epochs of one full-batch step each (pre-clip norms ~0.37, 0.32, 0.29: every step
    clipped, by a factor that differs from step to step, so Adam, nearly invariant to one
    constant gradient scale, ends ~1e-2 away from the unclipped run; 1 epoch gives ~5e-3).
    Without the clip in learn: no norms recorded and the parameters equal the unclipped run's.
    """
    max_grad_norm, epochs = 0.05, 3
    # independent of learn: the gradient norm of the first step, one process, full batch
    agent, _ = whole_batch_loss(batch_path)
    first_norm = float(torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in agent.parameters()])))
    assert first_norm > 2 * max_grad_norm

    single = run_learn(tmp_path, batch_path, world_size=1, batch_size=N, epochs=epochs, max_grad_norm=max_grad_norm)
    ddp = run_learn(tmp_path, batch_path, world_size=2, batch_size=N // 2, epochs=epochs, max_grad_norm=max_grad_norm)
    # every step was clipped, on the same (global) norm in both runs and on both ranks
    assert len(single[0]["grad_norms"]) == epochs, "learn did not call torch.nn.utils.clip_grad_norm_ each step"
    assert single[0]["grad_norms"][0] == pytest.approx(first_norm, rel=1e-5)
    for r in ddp:
        assert len(r["grad_norms"]) == epochs
        assert r["grad_norms"] == pytest.approx(single[0]["grad_norms"], rel=1e-5)
        assert min(r["grad_norms"]) > max_grad_norm
    assert_same_params(single[0]["params"], ddp[0]["params"], atol=1e-6)
    assert_same_params(ddp[0]["params"], ddp[1]["params"], atol=0)
    # and the clip acted: without it the same run ends elsewhere
    unclipped = run_learn(tmp_path, batch_path, world_size=1, batch_size=N, epochs=epochs)
    assert unclipped[0]["grad_norms"] == []
    diff = max((single[0]["params"][k] - unclipped[0]["params"][k]).abs().max() for k in single[0]["params"])
    assert diff > 1e-3, diff


# -- the gradient itself: averaged over ranks, equal to one process's on the whole batch --------------


def test_two_ranks_apply_the_gradient_of_one_process_on_the_whole_batch(tmp_path, batch_path):
    """The flat gradient each optimizer step applies, no clip: on 2 ranks of half batches it is the
    gradient autograd gives one process on the whole batch (computed here), on both ranks. Compared
    as gradients, not parameters after Adam: Adam is nearly blind to a constant scale, so a sum
    taken for the mean over ranks (twice the gradient) would move the parameters by ~1e-5 only."""
    agent, terms = whole_batch_loss(batch_path)
    expected = torch.cat([p.grad.reshape(-1) for p in agent.parameters()])
    assert expected.norm() > 0.1

    single = run_learn(tmp_path, batch_path, world_size=1, batch_size=N)
    ddp = run_learn(tmp_path, batch_path, world_size=2, batch_size=N // 2)
    accumulated = run_learn(tmp_path, batch_path, world_size=2, batch_size=N // 4, sync_freq=2)
    for r in [*single, *ddp, *accumulated]:
        assert len(r["step_grads"]) == 1
        torch.testing.assert_close(r["step_grads"][0], expected, rtol=1e-5, atol=1e-6)
        # the terms learn reports are the whole batch's (each minibatch's mean, averaged over all)
        for name in ("loss", "policy_loss", "value_loss", "entropy"):
            assert r["metrics"][0][f"train/{name}"] == pytest.approx(float(terms[name].detach()), rel=1e-5), name
