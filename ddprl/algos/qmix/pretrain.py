"""The loop of a graph-reconstructer stage (``stage=tokenizer|mask_predictor`` or a user's
:class:`~ddprl.algos.qmix.graph_stages.Stage`), top to bottom in :func:`train`:

1. every rank plays ``pretrain_episodes / world_size`` episodes at random (its own env seeds),
   keeping each living agent's observation at each step, sight-limited and full, as nodes; a
   tenth as many more episodes are held out for validation;
2. the stage builds its modules (those it takes from ``init_from`` frozen), DDP wraps the one
   it trains;
3. ``epochs`` passes over the observations, ``node_batch_size`` per rank per optimizer step;
   after every epoch a metrics row of train/ and val/ means over all ranks, and a checkpoint
   (``best.pt``: the lowest val/loss).

A resumed run plays the same episodes again (the same seeds: the data is not saved) and goes
on from its step with the same minibatch order and random draws.
"""

from __future__ import annotations

import functools
import logging
import math
import time
from typing import TYPE_CHECKING, Any

import torch

from ddprl.algos.qmix.graph_stages import NodeBatch, StageContext, StageLoss, codebook_metrics, stage_named
from ddprl.algos.qmix.learner import select_actions
from ddprl.checkpoint import load_checkpoint, strip_prefixes
from ddprl.envs.marl import MAObs, make_marl_env
from ddprl.envs.marl.graph import NodeLayout, NodeType
from ddprl.errors import UsageError
from ddprl.run import Run
from ddprl.runtime.seeding import derive_seed

if TYPE_CHECKING:
    from ddprl.algos.qmix.config import QMIXConfig
    from ddprl.runtime.collectives import Runtime

log = logging.getLogger("ddprl")


@torch.no_grad()
def play_at_random(
    env: Any, obs: MAObs, layout: NodeLayout, episodes: int, generator: torch.Generator
) -> tuple[NodeBatch, MAObs]:
    """Nodes of every living agent's observation at every step from ``obs`` until ``episodes``
    episodes ended on this rank's envs (kept on the CPU: the data set may be large), and the
    observation the envs are at then."""
    partial, full = [], []
    ended = 0
    while ended < episodes:
        alive = (obs.full != 0).any(-1)  # (N, A): a dead agent observes nothing
        partial.append(layout.to_nodes(obs.obs[alive]).cpu())
        full.append(layout.to_nodes(obs.full[alive]).cpu())
        actions = select_actions(torch.zeros(obs.avail.shape, device=obs.avail.device), obs.avail, 1.0, generator)
        obs, _, terminated, truncated, _ = env.step(actions)
        ended += int((terminated | truncated).sum())
    return NodeBatch(torch.cat(partial), torch.cat(full)), obs


def type_means(rt: Runtime, layout: NodeLayout, data: NodeBatch) -> torch.Tensor:
    """Collective: (3, W) mean full-observation features of each node type over its seen nodes, all ranks' data."""
    seen = layout.visible(data.full)  # (M, N)
    types = layout.type_ids()
    sums = torch.zeros(len(NodeType), layout.width, dtype=torch.float64)
    counts = torch.zeros(len(NodeType), dtype=torch.float64)
    for t in NodeType:
        where = seen & (types == t)
        sums[t] = data.full.double().mul(where[..., None]).sum((0, 1))
        counts[t] = where.sum()
    totals = rt.all_reduce_sum(torch.cat([sums.flatten(), counts]))
    sums, counts = totals[: sums.numel()].view_as(sums), totals[sums.numel() :]
    return (sums / counts.clamp_min(1)[:, None]).float()


def load_taken(stage: Any, modules: dict[str, torch.nn.Module], path: str) -> None:
    """Load the modules ``stage`` takes from the checkpoint ``path`` (another stage's)."""
    ckpt = load_checkpoint(path, expect_algo="qmix")
    networks = ckpt["state"].get("networks", {})
    for name in stage.takes:
        if name not in networks:
            raise UsageError(
                f"init_from={path} has no {name} (it holds {', '.join(networks) or 'none'}): give a checkpoint "
                f"of the stage that trains it"
            )
        try:
            modules[name].load_state_dict(networks[name])
        except RuntimeError as e:
            raise UsageError(
                f"init_from={path}: its {name} does not fit this config ({str(e).splitlines()[0][:160]}); "
                "give the same architecture keys as its run"
            ) from None


class StageLearner:
    """A stage's optimizer steps on N ranks: DDP wraps the module it trains; each step's loss is
    the global mean (this rank's sum over the count summed over ranks), so N ranks with B
    samples each take the step one process takes with the N x B; then the stage updates its
    state outside the gradient from statistics summed over ranks."""

    def __init__(
        self,
        rt: Runtime,
        stage: Any,
        modules: dict[str, torch.nn.Module],
        lr: float,
        max_grad_norm: float,
        compile: bool = False,
    ):
        self.rt, self.stage, self.modules, self.max_grad_norm = rt, stage, modules, max_grad_norm
        self.model = rt.wrap(modules[stage.trains], compile=compile)  # only what this stage trains
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=lr)

    def update(self, batch: NodeBatch, draws: torch.Generator) -> StageLoss:
        """One optimizer step on this rank's ``batch``; its metrics gain ``grad_norm`` (the
        averaged gradient's norm before the clip)."""
        rt = self.rt
        out = self.stage.loss(self.model, self.modules, batch, draws)
        # One all-reduce for the count and the statistics (known before the backward pass): a stage's
        # module is small, so each collective's latency, not its bytes, is what a step pays.
        names = list(out.statistics)
        parts = [out.count.detach().reshape(1), *(out.statistics[k].detach().reshape(-1) for k in names)]
        flat = rt.all_reduce_sum(torch.cat([p.to(torch.float64) for p in parts]))
        pieces = flat.split([p.numel() for p in parts])
        global_count = pieces[0].to(torch.float32).clamp_min(1).reshape(())
        summed = {
            k: piece.view_as(out.statistics[k]).to(out.statistics[k].dtype)
            for k, piece in zip(names, pieces[1:], strict=True)
        }
        (out.loss_sum * (rt.world_size / global_count)).backward()
        clip = self.max_grad_norm if self.max_grad_norm > 0 else float("inf")
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), clip).detach()
        out.metrics["grad_norm"] = (grad_norm.double(), torch.ones((), dtype=torch.float64))
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        gathered = {k: rt.all_gather(v) for k, v in out.samples.items()}
        self.stage.after_step(self.modules, summed, gathered)
        return out


class Sums:
    """Metric sums and counts of one window on this rank; :meth:`means` reduces them over ranks."""

    def __init__(self) -> None:
        self.sums: dict[str, torch.Tensor] = {}

    def add(self, out: StageLoss) -> None:
        """Add a step's sums, kept on their device (no host sync in the training step)."""
        parts = {"loss": (out.loss_sum.detach(), out.count), **out.metrics}
        for name, (total, count) in parts.items():
            pair = torch.stack([total.double(), torch.as_tensor(count).to(total.device, torch.float64)])
            self.sums[name] = self.sums[name] + pair if name in self.sums else pair

    def means(self, rt: Runtime, prefix: str) -> dict[str, float]:
        """Collective: ``prefix/name`` = global sum / global count (every rank has the same names)."""
        names = sorted(self.sums)
        totals = rt.all_reduce_sum(torch.stack([self.sums[n] for n in names])) if names else None
        self.sums = {}
        return {f"{prefix}/{n}": float(t[0] / t[1]) for n, t in zip(names, totals, strict=True) if t[1] > 0}


def batches_per_epoch(rt: Runtime, samples: int, batch_size: int) -> int:
    """Collective: minibatches every rank takes per epoch (the fewest any rank's data allows)."""
    fewest = min(rt.all_gather_object(samples)) if rt.world_size > 1 else samples
    if fewest < batch_size:
        raise UsageError(
            f"a rank collected {fewest} observations, fewer than node_batch_size={batch_size}: raise "
            "pretrain_episodes or lower node_batch_size"
        )
    return fewest // batch_size


def train(rt: Runtime, cfg: QMIXConfig) -> None:
    """Train the graph stage ``cfg.stage`` for ``cfg.epochs`` epochs (runs on every rank)."""
    stage = stage_named(cfg.stage)
    then = "stage=mask_predictor" if cfg.stage == "tokenizer" else "stage=qmix reconstruct=true"
    run = Run(
        rt,
        cfg,
        score_mode="min",
        rate_key="time/samples_per_s",
        score_name="val/loss",
        step_unit="optimizer steps",
        next_line=f"ddprl train algo=qmix task={cfg.task} {then} init_from={{best}}",
    )

    if run.resumed and run.counters.get("finished"):  # e.g. the pipeline's command run again
        log.info("stage=%s finished at step %d: nothing to do", cfg.stage, run.step)
        run.open(run.step)
        run.finish()
        return

    # -- 1. data: random play, the same episodes fresh or resumed ---------------------------------
    env = make_marl_env(
        cfg.task,
        cfg.local_num_envs(rt.world_size),
        seed=run.seeds.env(0),
        device=rt.device,
        **cfg.env_options(),
    )
    layout: NodeLayout = env.node_layout
    obs = env.reset(seed=run.seeds.env(0))
    play = torch.Generator(device=rt.device).manual_seed(derive_seed(cfg.seed, rt.rank, "env", 0))
    episodes = math.ceil(cfg.pretrain_episodes / rt.world_size)
    started = time.perf_counter()
    data, obs = play_at_random(env, obs, layout, episodes, play)
    val_data, _ = play_at_random(env, obs, layout, max(1, math.ceil(episodes / 10)), play)
    env.close()
    means = type_means(rt, layout, data)
    log.info(
        "played %d + %d episodes per rank at random in %.1f s: %d observations to train on, %d to validate (rank %d)",
        episodes,
        max(1, math.ceil(episodes / 10)),
        time.perf_counter() - started,
        len(data.full),
        len(val_data.full),
        rt.rank,
    )

    # -- 2. the stage's modules: the trained one wrapped, the taken ones frozen ------------------
    modules = stage.build(StageContext(layout, cfg, means))
    if run.resumed:
        for name, module in modules.items():
            module.load_state_dict(run.state["networks"][name])
    elif stage.takes:
        if not cfg.init_from:
            raise UsageError(
                f"stage={cfg.stage} trains on a frozen {', '.join(stage.takes)}: give init_from=<its checkpoint>"
            )
        load_taken(stage, modules, cfg.init_from)
    for name, module in modules.items():
        module.to(rt.device)
        if name != stage.trains:
            module.requires_grad_(False).eval()
    learner = StageLearner(rt, stage, modules, cfg.lr, cfg.max_grad_norm, cfg.compile)
    draws = torch.Generator(device=rt.device).manual_seed(run.seeds.torch(0))  # masks, revival candidates
    if run.resumed:
        learner.optimizer.load_state_dict(run.state["optimizer"])
    own = run.restore_rank_state()
    if own is not None:
        draws.set_state(own["draws"])
    checksum = rt.check_in_sync(learner.model)
    log.info("%s stage: trains %s (checksum %.6f over %d rank(s))", cfg.stage, stage.trains, checksum, rt.world_size)

    steps_per_epoch = batches_per_epoch(rt, len(data.full), cfg.node_batch_size)
    total_steps = steps_per_epoch * cfg.epochs
    run.open(total_steps)

    def save(step: int, score: float | None) -> None:
        rt.check_in_sync(learner.model, "parameters at checkpoint")
        state = {
            "networks": {name: strip_prefixes(m.state_dict()) for name, m in modules.items()},
            "optimizer": learner.optimizer.state_dict(),
            "type_means": means,
        }
        run.save(
            step,
            state,
            counters={"epoch": step // steps_per_epoch, "finished": step == total_steps},
            own={"draws": draws.get_state()},
            score=score,
        )

    # -- 3. epochs --------------------------------------------------------------------------------
    def shuffled(epoch: int) -> torch.Tensor:  # a stream of its own per epoch: a resume draws the same order
        return torch.randperm(
            len(data.full), generator=torch.Generator().manual_seed(derive_seed(cfg.seed, rt.rank, "torch", epoch))
        )

    step, window, window_start = run.step, Sums(), time.perf_counter()
    order = shuffled(step // steps_per_epoch)
    while step < total_steps:
        epoch, i = divmod(step, steps_per_epoch)
        if i == 0:
            order = shuffled(epoch)
        with run.split.phase("learn"):
            rows = order[i * cfg.node_batch_size : (i + 1) * cfg.node_batch_size]
            batch = NodeBatch(data.partial[rows].to(rt.device), data.full[rows].to(rt.device))
            out = learner.update(batch, draws)
        window.add(out)
        step += 1
        last = step == total_steps
        score = None
        if step % steps_per_epoch == 0:
            elapsed = time.perf_counter() - window_start
            row = window.means(rt, "train")
            row["train/epoch"] = float(step // steps_per_epoch)
            row["time/samples_per_s"] = steps_per_epoch * cfg.node_batch_size * rt.world_size / elapsed
            with run.split.phase("eval"):
                row.update(validate(rt, cfg, stage, modules, val_data))
            score = row["val/loss"]
            run.log(step, row)
            window_start = time.perf_counter()
        else:
            run.progress(step)
        run.step_boundary(step, functools.partial(save, step), score, step % steps_per_epoch == 0, last)
    run.finish()


@torch.no_grad()
def validate(
    rt: Runtime, cfg: QMIXConfig, stage: Any, modules: dict[str, torch.nn.Module], data: NodeBatch
) -> dict[str, float]:
    """Collective: the stage's validation metrics over every rank's held-out observations (the
    same masks at every epoch: a generator of their own)."""
    for module in modules.values():
        module.eval()
    sums, codes = Sums(), None
    draws = torch.Generator(device=rt.device).manual_seed(derive_seed(cfg.seed, rt.rank, "eval", 0))
    size = cfg.node_batch_size
    for start in range(0, len(data.full), size):
        batch = NodeBatch(
            data.partial[start : start + size].to(rt.device), data.full[start : start + size].to(rt.device)
        )
        out = stage.evaluate(modules, batch, draws)
        sums.add(out)
        if "code_counts" in out.statistics:
            counts = out.statistics["code_counts"].double()
            codes = counts if codes is None else codes + counts
    modules[stage.trains].train()
    row = sums.means(rt, "val")
    if codes is not None:
        row.update({f"val/{k}": v for k, v in codebook_metrics(rt.all_reduce_sum(codes)).items()})
    return row
