"""TD-MPC2's compiled regions on the CPU: the act's three (encode + plan start, one MPPI
iteration, the final draw) and the update (world model + policy + targets) each compile as ONE
graph (``fullgraph=True``), hold no host read, and compute what the eager code computes for
the same random numbers. On a GPU the same graphs are replayed as CUDA graphs (timed in
benchmarks/tdmpc2_speed.py, not here).
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path

import pytest
import torch

pytest.importorskip("dm_control")

from conftest import TDMPC2_TINY  # noqa: E402
from test_tdmpc2_loop import _batch_and_noise  # noqa: E402

from ddprl.algos.graphs import capture_graphs, host_syncs, training_step_unsupported  # noqa: E402
from ddprl.algos.tdmpc2.acting import Acting  # noqa: E402
from ddprl.algos.tdmpc2.buffer import TrajectoryBatch  # noqa: E402
from ddprl.algos.tdmpc2.learner import UpdateNoise, build_learner, model_dims, update  # noqa: E402
from ddprl.algos.tdmpc2.networks import WorldModel  # noqa: E402
from ddprl.algos.tdmpc2.planner import MPPI, MPPIConfig  # noqa: E402
from ddprl.config import load_config  # noqa: E402
from ddprl.runtime import compat, launch  # noqa: E402

# Regions need a torch whose Dynamo traces torch.func through modules (2.13 does, 2.4 does not):
# there compile=true falls back (PPO) or is refused (TD-MPC2), and these checks have nothing to check.
pytestmark = pytest.mark.skipif(training_step_unsupported() is not None, reason=str(training_step_unsupported()))

# small widths, and a short horizon and few iterations: the graph (and its compile time on a
# 2-core CPU) grows with the unrolled steps, not with the widths
TINY = [*TDMPC2_TINY, "horizon=2", "batch_size=8", "dropout=0"]  # later keys win
OBS, ACT, E = 5, 2, 2


def named(learner, values: torch.Tensor) -> dict[str, torch.Tensor]:
    """An update's metrics tensor as the loop reads it: one named 0-d tensor per term."""
    return dict(zip(learner.names, values, strict=True))


def tiny_cfg(*overrides: str):
    return load_config(
        [
            "algo=tdmpc2",
            "task=cartpole-balance",
            "world_size=1",
            "num_envs=1",
            "device=cpu",
            "dist_timeout=120",
            "progress=false",
            *TINY,
            *overrides,
        ]
    )


def tiny_model(cfg) -> WorldModel:
    torch.manual_seed(0)
    model = WorldModel(OBS, ACT, dims=model_dims(cfg), dropout=cfg.dropout)
    with torch.no_grad():  # Q and reward heads that are not zero, so plans depend on them
        model.qs.weight2.normal_(std=0.5)
        model.reward_head[-1].weight.normal_(std=0.5)
    return model


# --------------------------------------------------------------------------- act


def test_act_regions_are_one_graph_each_without_host_reads():
    cfg = tiny_cfg()
    acting = Acting(tiny_model(cfg), cfg, discount=0.99)
    obs, prev_mean = torch.randn(E, OBS), torch.zeros(cfg.horizon, E, ACT)
    start = acting.start_fn(obs, prev_mean, None)
    elites = acting.planner.iterate(*start)
    pieces = [
        (acting.start_fn, (obs, prev_mean, None)),
        (acting.planner.iterate, tuple(start)),
        (acting.planner.finish, (elites, False)),
        (acting.planner.finish, (elites, True)),
    ]
    for fn, args in pieces:  # what compile=true compiles, one by one
        graphs = capture_graphs(fn, *args)
        assert len(graphs) == 1 and host_syncs(graphs) == [], fn
    for eval_mode in (False, True):  # and the whole act traces as one graph too
        graphs = capture_graphs(acting.act_fn, obs, prev_mean, eval_mode)
        assert len(graphs) == 1 and host_syncs(graphs) == []


def test_compiled_act_chooses_the_eager_action_for_the_same_noise():
    cfg = tiny_cfg()
    model = tiny_model(cfg)
    eager, compiled = Acting(model, cfg, 0.99), Acting(model, cfg, 0.99, compile=True)
    g = torch.Generator().manual_seed(1)
    obs = torch.randn(3, E, OBS, generator=g)
    for t in range(3):  # the second and third steps are warm-started from the previous plan
        noise = eager.planner.draw_noise(E, obs[t], g)
        a_eager, a_compiled = eager(obs[t], noise=noise), compiled(obs[t], noise=noise)
        # float sums in another order (fused kernels): 1e-5 apart here; a different elite would be ~0.1
        torch.testing.assert_close(a_compiled, a_eager, atol=1e-4, rtol=0)
        torch.testing.assert_close(compiled.prev_mean, eager.prev_mean, atol=1e-4, rtol=0)
        done = torch.tensor([t == 1, False])  # env 0's episode ends after step 1: its plan is forgotten
        eager.episode_ended(done)
        compiled.episode_ended(done)
    # start, iterate, finish: one graph each, the iteration compiled once and replayed every time
    assert [(r.graphs, r.eager) for r in (compiled._start, compiled._iterate, compiled._finish)] == [(1, False)] * 3
    assert not torch.allclose(a_eager, eager(obs[0], noise=eager.planner.draw_noise(E, obs[0], g)))  # noise matters


def test_the_checks_catch_a_host_read_or_a_value_branch_in_a_region():
    # a toy planner (z' = z + a) whose reward callable does what no region may do
    def planner(reward_fn) -> MPPI:
        return MPPI(
            lambda z, a: z + a,
            reward_fn,
            lambda z, a: torch.zeros(*z.shape[:-1], 1),
            lambda z, eps: torch.tanh(z + eps),
            action_dim=1,
            discount=0.99,
            cfg=MPPIConfig(horizon=2, iterations=2, num_samples=16, num_elites=4, num_pi_trajs=2),
        )

    def reward(z, a):
        return -(z + a - 0.5).pow(2).sum(-1, keepdim=True)

    z = torch.zeros(E, 1)
    assert host_syncs(capture_graphs(planner(reward).plan, z)) == []
    moved = host_syncs(capture_graphs(planner(lambda z, a: reward(z, a).cpu()).plan, z))
    assert moved and all("cpu" in m for m in moved)
    moved = host_syncs(capture_graphs(planner(lambda z, a: reward(z, a).to("cpu")).plan, z))
    assert moved and all("CPU" in m for m in moved)
    read = host_syncs(capture_graphs(planner(lambda z, a: reward(z, a) * reward(z, a).max().item()).plan, z))
    assert any("item" in m for m in read)

    def branching(z, a):
        r = reward(z, a)
        return r if r.mean() > 0 else -r  # a Python branch on a value: breaks the graph

    with pytest.raises(Exception, match="(?i)data-dependent|graph break|unsupported"):
        capture_graphs(planner(branching).plan, z)


# --------------------------------------------------------------------------- update

H, B = 2, 8


def _data() -> dict[str, torch.Tensor]:
    return _batch_and_noise(H=H, B=B, every=3)  # the loop tests' batch, shorter: compile time grows with H


def updates_and_graph(rt, cfg, out: str, steps: int, fallen_back: bool = False) -> None:
    """``steps`` updates on fixed data and noise; the state after, and the update's graphs.
    ``fallen_back``: the compiled learner's region runs its eager function, as after a fallback."""
    torch.manual_seed(0)
    learner = build_learner(rt, cfg, OBS, ACT)
    learner.step.eager = fallen_back
    with torch.no_grad():
        learner.model.qs.weight2.normal_(generator=torch.Generator().manual_seed(0))
    learner.model.make_target()
    data = _data()
    batch = TrajectoryBatch(data["obs"], data["action"], data["reward"], data["terminated"])
    members = [data["members_td"], data["members_pi"]]
    metrics = []
    for _ in range(steps):
        noise = UpdateNoise(*members, data["eps_td"], data["eps_pi"])
        metrics.append(named(learner, update(rt, learner, [batch], [noise], cfg, 0.99)))
    result = {
        "region": (learner.step.graphs, learner.step.eager) if cfg.compile else None,
        "state": {k: v.clone() for k, v in learner.model.state_dict().items()},
        "scale": learner.scale.value.clone(),
        "metrics": metrics,
        "adam": [s["exp_avg_sq"].clone() for s in learner.wm_optim.state.values()],
    }
    if not cfg.compile:  # the update as Dynamo sees it (a fresh learner's region, never called here)
        args = (
            *(t.unsqueeze(0) for t in batch),
            members[0][None],
            members[1][None],
            data["eps_td"][None],
            data["eps_pi"][None],
            0.99,
        )
        with torch.no_grad():
            region = build_learner(rt, dataclasses.replace(cfg, compile=True), OBS, ACT).step
            captured = capture_graphs(region.fn, *args)
        result["graphs"], result["host_syncs"] = len(captured), host_syncs(captured)
    torch.save(result, Path(out) / ("fallen_back.pt" if fallen_back else f"compile{int(cfg.compile)}.pt"))


@pytest.mark.slow
def test_compiled_update_is_one_graph_and_equals_eager_after_steps(tmp_path):
    """compile=false, compile=true, and compile=true with the region fallen back to its eager
    function (torch.func gradients outside a graph): the same state after 3 updates."""
    for compile_, fallen_back in ((False, False), (True, False), (True, True)):
        cfg = tiny_cfg(f"compile={compile_}")
        launch(functools.partial(updates_and_graph, out=str(tmp_path), steps=3, fallen_back=fallen_back), cfg)
    eager, compiled, fallen = (torch.load(tmp_path / f) for f in ("compile0.pt", "compile1.pt", "fallen_back.pt"))
    assert eager["graphs"] == 1 and eager["host_syncs"] == []
    assert compiled["region"] == (1, False)  # one graph, run compiled (no fallback to eager)
    assert fallen["region"] == (0, True)
    for other in (compiled, fallen):
        for key, value in eager["state"].items():  # online, policy and target weights
            torch.testing.assert_close(other["state"][key], value, atol=1e-5, rtol=1e-4, msg=key)
        torch.testing.assert_close(other["scale"], eager["scale"], atol=1e-5, rtol=1e-5)
        for a, b in zip(other["adam"], eager["adam"], strict=True):
            torch.testing.assert_close(a, b, atol=1e-8, rtol=1e-3)
        for name, value in eager["metrics"][-1].items():
            # A metric's float32 rounding follows the largest value it took in the run, not its
            # last one: pi_q went -288, -73, -11.6 over the 3 updates and kept the ~1e-3 absolute
            # difference of the first (4e-6 relative there; the weights agree to 1e-6): fused and
            # eager kernels sum in different orders.
            largest = max(abs(float(m[name])) for m in eager["metrics"])
            torch.testing.assert_close(
                other["metrics"][-1][name], value, atol=max(1e-4, 1e-5 * largest), rtol=1e-4, msg=name
            )
    assert eager["scale"].item() > 1.0  # the Q scale moved: its statistic is part of the comparison
    # the updates really changed the model (equal no-ops would pass the checks above too)
    assert eager["metrics"][0]["train/loss"] != eager["metrics"][-1]["train/loss"]


# --------------------------------------------------------------------------- CUDA graphs (GPU only)


def cuda_regions(rt, cfg, out: str) -> None:
    """Act and update compiled on CUDA, replayed as CUDA graphs, against the eager code."""
    skips = compat.cudagraph_skip_count()
    torch.manual_seed(0)
    eager_learner = build_learner(rt, dataclasses.replace(cfg, compile=False), OBS, ACT)
    torch.manual_seed(0)
    graph_learner = build_learner(rt, cfg, OBS, ACT)
    data = {k: v.to(rt.device) for k, v in _data().items()}
    batch = TrajectoryBatch(data["obs"], data["action"], data["reward"], data["terminated"])
    fixed = UpdateNoise(
        torch.tensor([2, 0], device=rt.device), torch.tensor([1, 2], device=rt.device), data["eps_td"], data["eps_pi"]
    )
    for _ in range(4):  # the first calls record the graphs, the later ones replay them
        eager_metrics = named(eager_learner, update(rt, eager_learner, [batch], [fixed], cfg, 0.99))
        graph_metrics = named(graph_learner, update(rt, graph_learner, [batch], [fixed], cfg, 0.99))
    eager_act = Acting(eager_learner.model, cfg, 0.99)
    graph_act = Acting(graph_learner.model, cfg, 0.99, compile=True)
    g = torch.Generator(device=rt.device).manual_seed(0)
    obs = torch.randn(E, OBS, device=rt.device)
    actions = []
    for _ in range(4):
        noise = eager_act.planner.draw_noise(E, obs, g)
        actions.append((eager_act(obs, noise=noise), graph_act(obs, noise=noise)))
    for _ in range(3):  # the regions that draw their own noise: compiled, warmed up, recorded
        graph_act(obs)
    torch.cuda.set_sync_debug_mode("error")  # a replay must not wait for the host
    try:
        graph_metrics = named(graph_learner, update(rt, graph_learner, [batch], [fixed], cfg, 0.99))
        graph_act(obs)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    eager_metrics = named(eager_learner, update(rt, eager_learner, [batch], [fixed], cfg, 0.99))  # 5 updates each
    torch.save(
        {
            "eager": {k: v.cpu() for k, v in eager_learner.model.state_dict().items()},
            "graph": {k: v.cpu() for k, v in graph_learner.model.state_dict().items()},
            "metrics": [{k: v.cpu() for k, v in m.items()} for m in (eager_metrics, graph_metrics)],
            "actions": [(a.cpu(), b.cpu()) for a, b in actions],
            "cudagraph_skips": compat.cudagraph_skip_count() - skips,
            "fell_back": [
                r.name for r in (graph_learner.step, graph_act._start, graph_act._iterate, graph_act._finish) if r.eager
            ],
        },
        Path(out) / "cuda.pt",
    )


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_regions_replay_as_cuda_graphs_and_equal_eager(tmp_path):
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
            "compile=true",
        ]
    )
    launch(functools.partial(cuda_regions, out=str(tmp_path)), cfg)
    r = torch.load(tmp_path / "cuda.pt")
    assert r["cudagraph_skips"] == 0 and r["fell_back"] == []  # every region became a CUDA graph
    for key, value in r["eager"].items():
        torch.testing.assert_close(r["graph"][key], value, atol=1e-4, rtol=1e-3, msg=key)
    for name, value in r["metrics"][0].items():
        torch.testing.assert_close(r["metrics"][1][name], value, atol=1e-3, rtol=1e-3, msg=name)
    for eager_action, graph_action in r["actions"]:  # replays return fresh actions, not overwritten ones
        torch.testing.assert_close(graph_action, eager_action, atol=1e-3, rtol=0)
