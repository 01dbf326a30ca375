"""Functions run on every rank by tests through ``ddprl.runtime.launch`` (importable by spawn)."""

from __future__ import annotations

import atexit
import os
import time
from pathlib import Path

import torch

from ddprl.errors import UsageError


def collectives(rt, cfg, out: str) -> None:
    result = {
        "rank": rt.rank,
        "sum": rt.all_reduce_sum(rt.rank + 1),
        "mean_dict": rt.all_reduce_mean({"b": float(rt.rank), "a": 10.0 * (rt.rank + 1)}),
        "tensor_sum": rt.all_reduce_sum(torch.tensor([1.0, float(rt.rank)])),
        "tensor_mean": rt.all_reduce_mean(torch.tensor([1.0, 2.0 * rt.rank])),
        "int_mean": rt.all_reduce_mean(torch.tensor([rt.rank, 3])),
        "broadcast": rt.broadcast_object({"from": rt.rank}),
        "gathered": rt.all_gather_object(rt.rank * 2),
        "gathered_tensor": rt.all_gather(torch.tensor([[rt.rank, 10.0 * rt.rank]])),
    }
    torch.save(result, Path(out) / f"rank{rt.rank}.pt")


def denormal_product(rt, cfg, out: str | None = None) -> float:
    """A denormal float times one, as this rank computes it (written to ``out`` when given)."""
    product = (torch.tensor([1e-39]) * 1.0).item()
    if out is not None:
        (Path(out) / f"rank{rt.rank}.txt").write_text(repr(product))
    return product


def drifted_params(rt, cfg, out: str) -> None:
    """Ranks whose parameters differ must be caught by check_in_sync."""
    net = torch.nn.Linear(3, 2)
    with torch.no_grad():
        net.weight.fill_(float(rt.rank))  # no DDP broadcast: deliberately different
    try:
        rt.check_in_sync(net)
        caught = False
    except RuntimeError:
        caught = True
    wrapped = rt.wrap(torch.nn.Linear(3, 2))  # DDP broadcasts rank 0's weights
    rt.check_in_sync(wrapped)
    torch.save({"caught": caught}, Path(out) / f"rank{rt.rank}.pt")


def rank_one_raises(rt, cfg, out: str) -> None:
    if rt.rank == 1:
        raise ValueError("deliberate failure on rank 1")
    rt.barrier()  # rank 0 waits here for a rank that never comes
    time.sleep(600)


def first_error_exits_last(rt, cfg, out: str) -> None:
    """Rank 1 raises at once, then takes 8 s to end its process; rank 0 fails after it with what a
    broken collective says, and ends at once. The job's root cause is still rank 1's error."""
    raised = Path(out) / "rank1_raised"
    if rt.rank == 1:
        atexit.register(time.sleep, 8)  # runs after the rank reported its error, before the process ends
        raised.touch()
        raise ValueError("deliberate failure on rank 1")
    while not raised.exists():
        time.sleep(0.01)
    time.sleep(0.5)
    raise RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:1")


def rank_one_usage_error(rt, cfg, out: str) -> None:
    if rt.rank == 1:
        raise UsageError("bad input found inside a rank")
    rt.barrier()


def env_seeds(rt, cfg, out: str) -> None:
    from ddprl.envs import env_seed, make_env

    env = make_env("CartPole-v1", 2, seed=env_seed(cfg.seed, rt.rank))
    obs = env.reset()
    torch.save({"seed": env_seed(cfg.seed, rt.rank), "obs": obs}, Path(out) / f"rank{rt.rank}.pt")


def evaluate_fewer_episodes_than_ranks(rt, cfg, out: str) -> None:
    """One evaluation episode on 2 ranks: rank 1 runs none, yet joins the gather, and the
    collectives after it still line up."""
    from ddprl.envs import make_env
    from ddprl.evaluate import evaluate

    summary = evaluate(
        rt,
        lambda n, seed: make_env("CartPole-v1", n, seed=seed),
        lambda obs: torch.zeros(obs.shape[0], dtype=torch.long),
        episodes=1,
        seed=cfg.seed,
    )
    after = rt.all_reduce_sum(1)
    torch.save({"summary": summary, "after": after}, Path(out) / f"rank{rt.rank}.pt")


def rms_update(rt, cfg, out: str) -> None:
    from ddprl.normalize import RunningMeanStd

    g = torch.Generator().manual_seed(0)
    data = torch.randn(2, 50, 3, generator=g) * torch.tensor([1.0, 5.0, 0.1]) + 2.0
    rms = RunningMeanStd((3,))
    rms.update(data[rt.rank], reduce_sum=rt.all_reduce_sum)
    rms.update(data[rt.rank] * 2, reduce_sum=rt.all_reduce_sum)
    torch.save(rms.state_dict(), Path(out) / f"rank{rt.rank}.pt")


def make_agent():
    """The ActorCritic every PPO test starts from (seeded: the same weights in every process)."""
    import gymnasium as gym

    from ddprl.algos.ppo.networks import ActorCritic

    torch.manual_seed(0)
    return ActorCritic(gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(2), hidden_sizes=[16, 16])


class RecordingRuntime:
    """``rt`` as ``learn`` sees it, recording every scalar ``all_reduce_mean`` as (local, global).

    In ``learn`` the only scalar mean is the KL early-stop decision (one per epoch when
    ``target_kl`` is set; its metrics are reduced as a dict), so this is the per-epoch KL of
    this rank next to the KL averaged over ranks that decided.
    """

    def __init__(self, rt):
        self._rt = rt
        self.scalar_means: list[tuple[float, float]] = []

    def __getattr__(self, name):
        return getattr(self._rt, name)

    def all_reduce_mean(self, value):
        result = self._rt.all_reduce_mean(value)
        if isinstance(value, (int, float)) or (isinstance(value, torch.Tensor) and value.numel() == 1):
            self.scalar_means.append((float(value), float(result)))
        return result


def ppo_learn(rt, cfg, out: str, batch_path: str, steps: int = 1, per_rank: bool = False) -> None:
    """Run PPO's update phase on this rank's share of a fixed batch; save the parameters.

    ``per_rank``: the file holds a list of batches, one per rank, instead of one batch that is
    split. Besides parameters and checksums the file records what ``learn`` returned, how many
    optimizer steps this rank took (the optimizer state's ``step``), the pre-clip gradient
    norms of the update's clip, the gradient each step applied and the (local, global) KLs of
    the early-stop decisions.
    """
    from contextlib import nullcontext

    from ddprl.algos import graphs
    from ddprl.algos.ppo.update import UpdateStep, learn

    data = torch.load(batch_path)
    if per_rank:
        local = data[rt.rank]
    else:
        n = data["obs"].shape[0] // rt.world_size
        local = {k: v[rt.rank * n : (rt.rank + 1) * n] for k, v in data.items()}
    agent = make_agent()
    rt.broadcast_module(agent)
    opt = torch.optim.Adam(agent.parameters(), lr=1e-2, eps=1e-5)
    recorder = RecordingRuntime(rt)
    update = UpdateStep(recorder, agent, opt, local, cfg, lambda x: x, nullcontext())
    grad_norms: list[float] = []
    clip = graphs.clip_grad

    def recording_clip(*args, **kwargs):
        clipped, norm = clip(*args, **kwargs)
        grad_norms.append(float(norm))
        return clipped, norm

    # The optimizer step (graphs.FlatAdam.averaged_step_) looks clip_grad up at call time. With
    # world_size=1 this runs in the test process itself: restore the original afterwards.
    # the gradient each optimizer step applies (averaged over ranks, clipped): compared where Adam's
    # near-invariance to a constant scale would hide a sum taken for a mean
    step_grads: list[torch.Tensor] = []
    adam_step = graphs.FlatAdam.step_

    def recording_step(self, flat_grad):
        step_grads.append(flat_grad.detach().clone())
        return adam_step(self, flat_grad)

    graphs.clip_grad = recording_clip
    graphs.FlatAdam.step_ = recording_step
    try:
        torch.manual_seed(100 + rt.rank)
        metrics = [learn(recorder, update, cfg) for _ in range(steps)]
    finally:
        graphs.clip_grad = clip
        graphs.FlatAdam.step_ = adam_step
    checksums = rt.all_gather_object(float(sum(p.detach().double().sum() for p in agent.parameters())))
    optimizer_steps = int(opt.state[next(iter(agent.parameters()))]["step"]) if opt.state else 0
    torch.save(
        {
            "params": {k: v.clone() for k, v in agent.state_dict().items()},
            "checksums": checksums,
            "metrics": metrics,
            "optimizer_steps": optimizer_steps,
            "grad_norms": grad_norms,
            "step_grads": step_grads,
            "kl_decisions": recorder.scalar_means,
        },
        Path(out) / f"rank{rt.rank}.pt",
    )


def wrap_with_old_ddp(rt, cfg, out: str) -> None:
    """``rt.wrap`` against a DDP whose signature is torch 2.11's (no ``forward_sync_buffers``)."""
    from torch.nn.parallel import DistributedDataParallel

    from ddprl.runtime import collectives, compat

    seen = {}

    class OldDDP(DistributedDataParallel):
        def __init__(self, module, device_ids=None, broadcast_buffers=True, find_unused_parameters=False):
            seen["kwargs"] = {"broadcast_buffers": broadcast_buffers}
            super().__init__(
                module,
                device_ids=device_ids,
                broadcast_buffers=broadcast_buffers,
                find_unused_parameters=find_unused_parameters,
            )

    collectives.DDP, compat.DistributedDataParallel = OldDDP, OldDDP
    compat.ddp_accepts.cache_clear()
    net = torch.nn.BatchNorm1d(3)
    net.running_mean.fill_(float(rt.rank))  # a different buffer on each rank: wrap must make them agree
    wrapped = rt.wrap(net)
    torch.save(
        {"kwargs": seen["kwargs"], "buffer": rt.unwrap(wrapped).running_mean.clone()}, Path(out) / f"rank{rt.rank}.pt"
    )


def qmix_learn(rt, cfg, out: str, batch_path: str, steps: int = 1) -> None:
    """QMIX updates on this rank's share of fixed episode batches; save live and target weights.

    The file holds ``steps`` lists of ``sync_freq`` batches each; every rank takes its
    contiguous share of the episodes of each batch.
    """
    from ddprl.algos.qmix.learner import QLearner
    from ddprl.algos.qmix.networks import AgentNet, QMixer, QNetwork

    data = torch.load(batch_path)
    torch.manual_seed(0)  # the same initial weights everywhere (DDP would broadcast rank 0's anyway)
    a, u, o, s = data["dims"]
    net = QNetwork(
        AgentNet(o + a, u, 16, use_rnn=cfg.use_rnn), QMixer(a, s, 8, 2, 16), u, agent_id=True, last_action=False
    )
    learner = QLearner(rt, cfg, net)
    metrics = []
    for step_batches in data["steps"][:steps]:
        local = []
        for batch in step_batches:
            n = batch["filled"].shape[0] // rt.world_size
            local.append({k: v[rt.rank * n : (rt.rank + 1) * n] for k, v in batch.items()})
        metrics.append(learner.update(local))
    torch.save(
        {
            "params": {k: v.clone() for k, v in learner.net.state_dict().items()},
            "target": {k: v.clone() for k, v in learner.target.state_dict().items()},
            "reward_mean": float(learner.reward_stats.mean),
            "metrics": metrics,
            "updates": learner.updates,
        },
        Path(out) / f"rank{rt.rank}.pt",
    )


def qmix_wrapped_modules(rt, cfg, out: str) -> None:
    """Build a stage's learner the way the loop does; record which parameters DDP synchronises."""
    from ddprl.algos.qmix.learner import AutoencoderLearner, QLearner
    from ddprl.algos.qmix.loop import build_networks, init_from_checkpoint, q_network
    from ddprl.algos.qmix.networks import Autoencoder
    from ddprl.envs.marl import make_marl_env

    env = make_marl_env(cfg.task, 1, seed=rt.rank)
    nets = build_networks(cfg, env)
    if cfg.init_from:
        init_from_checkpoint(nets, cfg.init_from)
    if cfg.stage == "pretrain":
        learner = AutoencoderLearner(rt, cfg, Autoencoder(nets["encoder"], nets["decoder"]))
    else:
        learner = QLearner(rt, cfg, q_network(cfg, env, nets))
    ddp = type(learner.model).__name__ == "DistributedDataParallel"
    synced = sorted({name.split(".")[1] for name, p in learner.model.named_parameters() if p.requires_grad})
    torch.save({"ddp": ddp, "synced": synced}, Path(out) / f"rank{rt.rank}.pt")


def ppo_learn_compiled(rt, cfg, out: str, batch_path: str, steps: int = 1, backend: str = "inductor") -> None:
    """``learn`` with each optimizer step one compiled graph (gradients averaged inside it by
    ``rt.region_mean``) on this rank's half of a fixed batch; saves what ``ppo_learn`` saves.

    Rank 1 starts from other weights on purpose: ``rt.broadcast_module`` must replace them by
    rank 0's. ``backend``: torch.compile's (``aot_eager`` traces the same whole graph,
    collective included, without inductor's codegen).
    """
    from contextlib import nullcontext

    from ddprl.algos.ppo import update as ppo_update
    from ddprl.algos.ppo.update import UpdateStep, learn

    if backend != "inductor":
        ppo_update.compile_region = lambda fn, device, world_size=1, name=None, compile_cache=True: torch.compile(
            fn, fullgraph=True, dynamic=False, backend=backend
        )

    data = torch.load(batch_path)
    n = data["obs"].shape[0] // rt.world_size
    local = {k: v[rt.rank * n : (rt.rank + 1) * n].clone() for k, v in data.items()}
    agent = make_agent()
    if rt.rank == 1:
        with torch.no_grad():
            for p in agent.parameters():
                p.add_(1.0)
    rt.broadcast_module(agent)
    opt = torch.optim.Adam(agent.parameters(), lr=1e-2, eps=1e-5)
    update = UpdateStep(rt, agent, opt, local, cfg, lambda x: x, nullcontext(), compile=True)
    torch.manual_seed(100 + rt.rank)
    metrics = [learn(rt, update, cfg) for _ in range(steps)]
    checksums = rt.all_gather_object(float(sum(p.detach().double().sum() for p in agent.parameters())))
    torch.save(
        {"params": {k: v.clone() for k, v in agent.state_dict().items()}, "checksums": checksums, "metrics": metrics},
        Path(out) / f"rank{rt.rank}.pt",
    )


def host_collectives(rt, cfg, out: str) -> None:
    """Sums through whichever collectives the job chose: several dtypes, a tensor larger than a
    shared-memory slot (chunks), a DDP model's averaged gradient, and objects (one larger than a slot)."""
    from ddprl.algos import graphs
    from ddprl.runtime import shm

    big = torch.arange(shm.SLOT_BYTES // 4 * 2 + 5, dtype=torch.float32) * (rt.rank + 1)
    model = torch.nn.Linear(3, 2)
    wrapped = rt.wrap(model)
    x = torch.full((4, 3), float(rt.rank + 1))
    wrapped(x).sum().backward()
    result = {
        "shm": rt._host is not None,
        "float64": rt.all_reduce_sum(torch.tensor([0.1, 1e-20], dtype=torch.float64) * (rt.rank + 1)),
        "int64": rt.all_reduce_sum(torch.tensor([2**40 + rt.rank], dtype=torch.int64)),
        "big": rt.all_reduce_sum(big),
        "region_mean": rt.region_mean(torch.tensor([1.0, 3.0]) * rt.rank),
        # inside a compiled region (inductor: the op is called, not traced), and the graph's ops
        "compiled_region_mean": torch.compile(rt.region_mean, fullgraph=True)(big),
        "region_graph": str(graphs.capture_graphs(rt.region_mean, big)[0].graph),
        "transposed": rt.all_reduce_sum(torch.arange(6.0).view(2, 3).t() * (rt.rank + 1)),
        "grad": model.weight.grad.clone(),
        "collective_s": rt.collective_s,
        "gathered": rt.all_gather_object({"rank": rt.rank, "empty": ""}),
        "broadcast": rt.broadcast_object(f"from rank {rt.rank}", src=1),
        # rank 1's object is larger than a slot: both ranks go through gloo
        "mixed": [len(x) for x in rt.all_gather_object(b"x" * (3 if rt.rank == 0 else shm.SLOT_BYTES))],
        "after": rt.all_gather_object(rt.rank * 10),  # the rounds stay in step after a fallback
    }
    torch.save(result, Path(out) / f"rank{rt.rank}.pt")


def affinity(rt, cfg, out: str) -> None:
    """The cores this rank and a process it starts may run on."""
    import json
    import subprocess
    import sys

    code = "import json, os; print(json.dumps(sorted(os.sched_getaffinity(0))))"
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    cores = {"rank": sorted(os.sched_getaffinity(0)), "child": json.loads(child.stdout)}
    torch.save(cores, Path(out) / f"rank{rt.rank}.pt")


def graph_stage_learn(rt, cfg, out: str, data_path: str, steps: int) -> None:
    """A graph stage's updates on this rank's share of fixed node batches; save its modules'
    weights and buffers (a codebook) and each update's gradient norm."""
    from ddprl.algos.qmix.graph_stages import NodeBatch, StageContext, stage_named
    from ddprl.algos.qmix.pretrain import StageLearner
    from ddprl.envs.marl.graph import NodeLayout

    data = torch.load(data_path)
    layout = NodeLayout(*data["layout"])
    torch.manual_seed(0)  # the same initial weights everywhere (DDP would broadcast rank 0's anyway)
    stage = stage_named(cfg.stage)
    modules = stage.build(StageContext(layout, cfg, torch.zeros(3, layout.width)))
    for name in stage.takes:
        modules[name].requires_grad_(False).eval()
    learner = StageLearner(rt, stage, modules, cfg.lr, cfg.max_grad_norm)
    draws = torch.Generator().manual_seed(0)
    norms = []
    for partial, full in zip(data["partial"][:steps], data["full"][:steps], strict=True):
        n = partial.shape[0] // rt.world_size
        mine = slice(rt.rank * n, (rt.rank + 1) * n)
        norms.append(float(learner.update(NodeBatch(partial[mine], full[mine]), draws).metrics["grad_norm"][0]))
    torch.save(
        {"state": {k: {n: v.clone() for n, v in m.state_dict().items()} for k, m in modules.items()}, "norms": norms},
        Path(out) / f"rank{rt.rank}.pt",
    )
