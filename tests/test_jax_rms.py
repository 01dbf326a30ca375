"""The JAX engine's running statistics, merged over 2 simulated CPU devices (tests/conftest.py sets 4),
against float64 and against the torch engine's RunningMeanStd on the same data.

The hard case is a mean that is large against the spread (an observation like a position far from
the origin): float32 moments E[x^2] - mean^2 cancel to a variance of 0 there.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

jax = pytest.importorskip("jax")
from jax.sharding import Mesh  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from ddprl.algos.ppo_jax.learn import rms_init, rms_update  # noqa: E402
from ddprl.jax.runtime import AXIS  # noqa: E402
from ddprl.normalize import RunningMeanStd  # noqa: E402

DEVICES = 2
PER_DEVICE = 2048


def sharded_update():
    """``rms_update`` as the PPO iteration runs it: rows split over 2 devices, statistics replicated."""
    assert len(jax.devices()) >= DEVICES, "tests/conftest.py asks for 4 simulated devices"
    mesh = Mesh(np.array(jax.devices()[:DEVICES]), (AXIS,))
    return jax.jit(jax.shard_map(rms_update, mesh=mesh, in_specs=(P(), P(AXIS)), out_specs=P(), check_vma=True))


def torch_update(rms: RunningMeanStd, x: np.ndarray) -> None:
    """The torch engine's update on 2 ranks: each half's moments, summed as ``all_reduce_sum`` would."""
    halves = np.split(x, DEVICES)
    rms.update_from_moments(sum(rms.moments(torch.from_numpy(h)) for h in halves))


def test_large_mean_small_spread_on_two_devices():
    rng = np.random.default_rng(0)
    x = (1e4 + rng.standard_normal(DEVICES * PER_DEVICE)).astype(np.float32)
    out = jax.device_get(sharded_update()(rms_init(()), x))
    exact = x.astype(np.float64)
    assert out["count"] == DEVICES * PER_DEVICE
    # float32 holds 1e4 to within ~1e-3: the mean is right to its last digits
    assert abs(out["mean"] - exact.mean()) < 2e-3
    assert out["var"] == pytest.approx(exact.var(), rel=0.02)
    reference = RunningMeanStd(())
    torch_update(reference, x)
    assert out["mean"] == pytest.approx(reference.mean.item(), abs=2e-3)
    assert out["var"] == pytest.approx(reference.var.item(), rel=1e-3)


def test_successive_updates_equal_the_statistics_of_all_data_seen():
    # 3 features on very different scales; each batch drifts, so every merge has a between-batch term.
    rng = np.random.default_rng(1)
    loc, scale = np.array([1e4, -50.0, 0.0]), np.array([1.0, 3.0, 0.1])
    update, stats, reference, seen = sharded_update(), rms_init((3,)), RunningMeanStd((3,)), []
    for drift in (0.0, 2.0, -1.0):
        x = (loc + drift + scale * rng.standard_normal((DEVICES * PER_DEVICE, 3))).astype(np.float32)
        stats = update(stats, x)
        torch_update(reference, x)
        seen.append(x.astype(np.float64))
    out, everything = jax.device_get(stats), np.concatenate(seen)
    assert out["count"] == len(everything) == 3 * DEVICES * PER_DEVICE
    np.testing.assert_allclose(out["mean"], everything.mean(0), rtol=0, atol=2e-3)
    np.testing.assert_allclose(out["var"], everything.var(0), rtol=0.02)
    np.testing.assert_allclose(out["mean"], reference.mean.numpy(), rtol=0, atol=2e-3)
    np.testing.assert_allclose(out["var"], reference.var.numpy(), rtol=1e-3)
    # the drift is in the variance: one batch's spread alone would be scale ** 2
    assert out["var"][0] > 1.5
