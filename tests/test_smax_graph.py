"""SMAX's full observations (``full_obs=True``) and the node view of a unit-list observation
(``env.node_layout``), against the sight-limited observation and the battle's own state."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch

from ddprl.envs.marl import MAObs, make_marl_env
from ddprl.envs.marl.graph import NodeLayout, NodeType
from ddprl.errors import UsageError

needs_jaxmarl = pytest.mark.skipif(
    importlib.util.find_spec("jaxmarl") is None, reason="jaxmarl (Python 3.11+) is not installed"
)
# scenario: (allies, enemies)
SCENARIOS = {"smax/3m": (3, 3), "smax/2s3z": (5, 5), "smax/5m_vs_6m": (5, 6)}


def random_actions(obs: MAObs, gen: torch.Generator) -> torch.Tensor:
    n, a, u = obs.avail.shape
    return torch.multinomial(obs.avail.reshape(n * a, u).float(), 1, generator=gen).reshape(n, a)


def test_layout_round_trip_and_visibility():
    types = (NodeType.SELF, NodeType.ALLY, NodeType.ENEMY)
    layout = NodeLayout(obs_dim=9, types=types, slices=((7, 9), (0, 3), (3, 7)))
    assert layout.n_nodes == 3 and layout.width == 4
    obs = torch.randn(5, 2, 9)
    nodes = layout.to_nodes(obs)
    assert nodes.shape == (5, 2, 3, 4)
    assert torch.equal(nodes[..., 0, :2], obs[..., 7:]) and torch.equal(nodes[..., 1, :3], obs[..., :3])
    assert (nodes[..., 0, 2:] == 0).all() and (nodes[..., 1, 3:] == 0).all()  # padding
    assert torch.equal(layout.from_nodes(nodes), obs) and torch.equal(layout.to_nodes(layout.from_nodes(nodes)), nodes)
    assert torch.equal(layout.feature_mask(), nodes[0, 0] != 0)
    obs[0, 0] = 0
    assert layout.visible(layout.to_nodes(obs))[0, 0].tolist() == [True, False, False]  # SELF always seen
    with pytest.raises(ValueError, match="do not tile"):
        NodeLayout(obs_dim=9, types=(NodeType.SELF, NodeType.ALLY), slices=((0, 3), (2, 9)))


def unit_index(n_allies: int, n_units: int) -> np.ndarray:
    """(A, n_nodes): the unit each node of ally i shows (SELF first, then the others by index)."""
    return np.array([[i, *(j for j in range(n_units) if j != i)] for i in range(n_allies)])


def check_full(layout: NodeLayout, obs: MAObs, alive: np.ndarray | None = None) -> int:
    """Assert what ``obs.full`` must be against ``obs.obs`` (and, given, against which units are
    alive: (N, units) bool); return how many units are hidden by sight range alone."""
    limited, full = layout.to_nodes(obs.obs), layout.to_nodes(obs.full)
    seen, exists = layout.visible(limited), (full != 0).any(-1)
    assert torch.equal(limited[seen], full[seen])  # what an agent sees, it sees the same
    assert not (seen[..., 1:] & ~exists[..., 1:]).any()  # zero with full sight: zero with limited sight
    if alive is not None:
        index = unit_index(*obs.obs.shape[1:2], alive.shape[1])
        observer_alive = alive[:, : index.shape[0], None]
        unit_alive = torch.from_numpy(alive[:, index] & observer_alive)  # (N, A, n_nodes)
        assert torch.equal(exists, unit_alive)  # a unit's block is filled exactly when both are alive
    return int((~seen & exists).sum())


@needs_jaxmarl
@pytest.mark.parametrize("task", SCENARIOS)
def test_full_obs_fills_in_what_sight_hides(task):
    n_allies, n_enemies = SCENARIOS[task]
    env = make_marl_env(task, 4, seed=0, full_obs=True, time_limit=25)
    layout = env.node_layout
    assert layout.types == (NodeType.SELF, *[NodeType.ALLY] * (n_allies - 1), *[NodeType.ENEMY] * n_enemies)
    assert layout.width == 13 and layout.obs_dim == env.obs_dim == 13 * (n_allies + n_enemies - 1) + 10
    assert layout.slices[0] == (env.obs_dim - 10, env.obs_dim)  # SMAX puts its own features last
    gen = torch.Generator().manual_seed(0)
    obs = env.reset()
    assert obs.full is not None and obs.full.shape == obs.obs.shape and obs.full.dtype == torch.float32
    hidden, ended, deaths = check_full(layout, obs, np.asarray(env._state.state.unit_alive)), 0, 0
    for _ in range(200):
        obs, _, terminated, truncated, info = env.step(random_actions(obs, gen))
        alive = np.asarray(env._state.state.unit_alive)
        hidden += check_full(layout, obs, alive)
        deaths += int((~alive).sum())
        for x in (obs.obs, obs.full):
            assert torch.equal(layout.from_nodes(layout.to_nodes(x)), x)
        final = info["final_obs"]
        assert final.full is not None and final.full.shape == obs.obs.shape
        done = terminated | truncated
        if done.any():
            ended += int(done.sum())
            check_full(layout, MAObs(*(x[done] for x in final)))
            assert not torch.equal(final.full[done], obs.full[done])  # the last step's, not the next episode's
    assert hidden > 0 and ended > 0 and deaths > 0


@needs_jaxmarl
def test_without_full_obs_nothing_changes():
    plain, full = (make_marl_env("smax/3m", 2, seed=3, time_limit=10, full_obs=f) for f in (False, True))
    gen = torch.Generator().manual_seed(0)
    a, b = plain.reset(), full.reset()
    assert a.full is None and a.to("cpu").full is None and b.to("cpu").full is not None
    for _ in range(20):
        actions = random_actions(a, gen)
        (a, *ra, ia), (b, *rb, ib) = plain.step(actions), full.step(actions)
        assert a.full is None and ia["final_obs"].full is None
        for x, y in [*zip(a[:4], b[:4], strict=True), *zip(ra, rb, strict=True)]:
            assert torch.equal(x, y)
        assert torch.equal(ia["final_obs"].obs, ib["final_obs"].obs)


@needs_jaxmarl
def test_full_obs_needs_a_unit_list():
    conic = make_marl_env("smax/3m", 1, seed=0, observation_type="conic")
    assert not hasattr(conic, "node_layout")
    with pytest.raises(UsageError, match="smax/3m: full_obs needs observation_type=unit_list"):
        make_marl_env("smax/3m", 1, seed=0, observation_type="conic", full_obs=True)
    with pytest.raises(UsageError, match="smax/3m: full_obs must be true or false"):
        make_marl_env("smax/3m", 1, seed=0, full_obs="yes")


@pytest.mark.parametrize("task", ["Foraging-8x8-2p-2f-coop-v3", "simple_speaker_listener_v4", "vmas/balance"])
def test_full_obs_elsewhere_is_a_usage_error(task):
    with pytest.raises(UsageError, match=f"{task} gives no full observation") as caught:
        make_marl_env(task, 1, seed=0, full_obs=True)
    assert "\n" not in str(caught.value)


@needs_jaxmarl
def test_a_shortened_sight_range_hides_more_of_the_same_battle():
    # per-unit-type lists from the command line (env_kwargs.unit_type_sight_ranges=[6,6,6,6,6,6])
    default = make_marl_env("smax/3m", 4, seed=3, full_obs=True)
    short = make_marl_env("smax/3m", 4, seed=3, full_obs=True, unit_type_sight_ranges=[6.0] * 6)
    layout, gen = default.node_layout, torch.Generator().manual_seed(0)
    a, b = default.reset(seed=3), short.reset(seed=3)
    seen_default = seen_short = 0
    for _ in range(15):
        seen_default += int(layout.visible(layout.to_nodes(a.obs)).sum())
        seen_short += int(layout.visible(layout.to_nodes(b.obs)).sum())
        # the same battle: who is where does not depend on sight (positions scale with it)
        assert torch.equal(layout.visible(layout.to_nodes(a.full)), layout.visible(layout.to_nodes(b.full)))
        actions = random_actions(a, gen)
        a, b = default.step(actions)[0], short.step(actions)[0]
    assert seen_short < seen_default
