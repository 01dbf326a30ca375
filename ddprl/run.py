"""One training job on every rank: resume state, seeds, run directory, metrics and checkpoints.

    <run_dir>/config.yaml  metrics.jsonl  tb/  checkpoints/step_<N>.pt  latest.pt  best.pt

Every algorithm's loop uses :class:`Run` the same way, so saving and resuming are written once:

    run = Run(rt, cfg)                         # reads the checkpoint being resumed (once), seeds torch
    env = make_env(..., seed=run.env_seed)     # resumed: seeds derived from the resume step
    parts = {"model": model, "optimizer": optimizer}   # the shared state, by checkpoint key
    run.restore(parts)                         # resumed: each part's saved state loaded
    own = run.restore_rank_state()             # this rank's saved state (RNG restored), or None
    run.open(total_steps)                      # collective: directory, config.yaml, metrics, TensorBoard
    run.log(step, metrics)                     # every rank calls; rank 0 writes
    run.save_own_file({"buffer": ...}, path)  # a rank's own file of the next checkpoint (replay buffer)
    run.save(step, state_of(parts), counters={...}, own={"env": ...}, score=eval_return)   # collective
    run.step_boundary(step, save, score=eval_return, due=..., last=...)   # collective: checkpoint, preemption
    with run.split.phase("env"): ...           # where the time goes: time/<phase>_s in every row
    run.finish()                               # close the sinks; rank 0 prints the summary block

Rank 0 names and creates the directory and broadcasts its path: one directory per job. A write
that does not fit (a full disk) is said by every rank together at the next collective here
(:class:`~ddprl.errors.DiskFull`, exit code 74), so that no rank is left waiting in one.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import random
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, cast

import numpy as np
import torch

from ddprl import registry
from ddprl.checkpoint import (
    Checkpointer,
    Stateful,
    forget_checkpoint,
    load_checkpoint,
    rng_state,
    save_atomically,
    set_rng_state,
)
from ddprl.config import save_yaml, to_dict
from ddprl.errors import DiskFull, UsageError
from ddprl.metrics import MetricsLogger
from ddprl.runtime.failures import hosts_if_several, ranks_on_hosts
from ddprl.runtime.preemption import Preempted, StopCheck
from ddprl.timesplit import PHASES, TimeSplit, shares

if TYPE_CHECKING:
    from ddprl.config.schema import JobConfig, RLConfig
    from ddprl.runtime.protocol import JobRuntime

log = logging.getLogger("ddprl")

DISK_FULL_KEY = "disk_full"  # a flag in the time split's reduction, never logged


def default_run_dir(cfg: JobConfig) -> Path:
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    path = Path("runs") / f"{cfg.run_name()}-{stamp}"
    suffix = 1
    while path.exists():  # two jobs started in the same second
        path = Path("runs") / f"{cfg.run_name()}-{stamp}-{suffix}"
        suffix += 1
    return path


def open_run_dir(rt: JobRuntime, cfg: JobConfig) -> Path:
    """Collective: rank 0 names the run directory (``run_dir``, else a new default one); all get
    its path. Nothing is written yet (:func:`prepare_run_dir`)."""
    path = None
    if rt.is_main:
        path = str((Path(cfg.run_dir) if cfg.run_dir else default_run_dir(cfg)).resolve())
    return Path(rt.broadcast_object(path))


def prepare_run_dir(path: Path, cfg: JobConfig) -> None:
    """Rank 0: create the run directory, remove what an interrupted job left half-written
    (``*.tmp``: its job is over, the run directory's lock says so), write config.yaml."""
    (path / "checkpoints").mkdir(parents=True, exist_ok=True)
    folders = (path, path / "checkpoints", path / "checkpoints" / "buffers")
    leftovers = [p for folder in folders for p in folder.glob("*.tmp")]
    for p in leftovers:
        p.unlink(missing_ok=True)
    if leftovers:
        log.info("removed %s: left half-written by an interrupted job", ", ".join(p.name for p in leftovers))
    save_yaml(cfg, path / "config.yaml")


def _duration(seconds: float) -> str:
    """``42 s``, ``3 min 05 s``, ``2 h 04 min``."""
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"


def seed_generators(seed: int) -> None:
    """Seed this process's global generators (torch, numpy, random) with one seed."""
    torch.manual_seed(seed)
    np.random.seed(seed % 2**32)
    random.seed(seed)


class Run:
    """The job-level state every algorithm shares; see the module docstring for the calls.

    ``score_mode``: "max" (eval return) or "min" (a loss) decides which ``score`` is best, and
    ``score_name`` names it; ``rate_key`` names the metric the progress bar shows as a rate;
    ``step_unit`` says what the global step counts (the summary's words).
    """

    def __init__(
        self,
        rt: JobRuntime,
        cfg: JobConfig,
        score_mode: str = "max",
        rate_key: str = "time/global_fps",
        score_name: str = "eval/return_mean",
        step_unit: str = "steps",
        next_line: str | None = None,
    ):
        self.rt, self.cfg, self.score_mode, self.rate_key = rt, cfg, score_mode, rate_key
        self.next_line = next_line  # what to run next, for a job that trains no policy (a pretraining stage)
        self.score_name, self.step_unit = score_name, step_unit
        self.checkpoint = load_checkpoint(cfg.resume, expect_algo=cfg.algo) if cfg.resume else None
        forget_checkpoint()  # this Run holds it now; nothing else in the process needs the file again
        self.step = int(self.checkpoint["step"]) if self.checkpoint else 0
        self._same_checkpoint_everywhere()
        self.seeds = rt.seeds(cfg.seed)
        self.best: dict[str, Any] | None = self.checkpoint.get("best") if self.checkpoint else None
        self.dir: Path | None = None
        self._stop_check = StopCheck(rt)
        # the loop marks env/act/learn; evaluation and checkpoints are marked here
        self.split = TimeSplit(lambda: getattr(rt, "collective_s", 0.0))
        self.split_totals = dict.fromkeys(PHASES, 0.0)  # seconds per phase, mean over ranks, whole run
        self._started = time.perf_counter()
        self.last_step = self.step  # of the last row logged
        self.last_eval: tuple[int, dict[str, float]] | None = None  # (step, eval/ and test/ metrics) last logged
        self._full: DiskFull | None = None  # this rank's write that did not fit, until every rank knows
        # Per-rank randomness (action sampling, minibatch order, init on rank 0 before the
        # broadcast). A resumed run starts from a stream of its resume step, never step 0's.
        seed_generators(self.seeds.torch(self.step))

    def _same_checkpoint_everywhere(self) -> None:
        """Collective: every rank resumes from the same step, or none does. Each machine of a job
        reads the checkpoint itself; a run directory that is not on a file system they share
        would have the ranks of one machine start afresh and the others resume, and their
        collectives would wait for each other until dist_timeout."""
        if self.rt.world_size == 1:
            return
        views = self.rt.all_gather_object(self.step if self.resumed else None)
        differ = [rank for rank, view in enumerate(views) if view != views[0]]
        if not differ:
            return
        hosts = hosts_if_several(self.rt.hosts)

        def what(view: int | None) -> str:
            return "no checkpoint" if view is None else f"the checkpoint of step {view}"

        raise UsageError(
            f"{ranks_on_hosts(differ, hosts)} found {what(views[differ[0]])}, rank 0 {what(views[0])}: every "
            "machine of a job reads the checkpoint itself, so keep run_dir (and resume=) on a file system "
            "they all share"
        )

    @property
    def resumed(self) -> bool:
        return self.checkpoint is not None

    @property
    def state(self) -> dict[str, Any]:
        """The shared state saved by the interrupted run (weights, optimizers, statistics)."""
        return self.checkpoint["state"]

    @property
    def counters(self) -> dict[str, Any]:
        """The loop's own counters saved with the checkpoint."""
        return self.checkpoint["counters"]

    @property
    def same_world(self) -> bool:
        return self.resumed and self.checkpoint["world_size"] == self.rt.world_size

    @property
    def env_seed(self) -> int:
        """First seed of this rank's training envs: the classic one fresh, a derived one when resumed."""
        return self.seeds.env(self.step)

    def restore(self, parts: Mapping[str, Stateful | None]) -> None:
        """Load the resumed run's shared state into ``parts``, by checkpoint key (a None part is
        one this job lacks); nothing when the run is fresh. :func:`~ddprl.checkpoint.state_of`
        writes the same table into a checkpoint."""
        if not self.resumed:
            return
        for name, part in parts.items():
            if part is not None:
                part.load_state_dict(self.state[name])

    def restore_rank_state(self) -> dict[str, Any] | None:
        """This rank's own saved state (its RNG restored), or None.

        Call it where the interrupted run saved (after building the model: building draws from
        the generators). With another world size no rank has a state of its own to continue:
        the generators are reseeded from (seed, resume step, rank) and one line says so.
        """
        if not self.resumed:
            return None
        if self.same_world:
            own = self.checkpoint["ranks"][self.rt.rank]
            set_rng_state(own["rng"])
            return own
        reset = sorted(self.checkpoint["ranks"][0]) if self.checkpoint["ranks"] else []
        (log.warning if self.rt.rank == 0 else log.debug)(
            "resuming a %d-rank checkpoint on %d rank(s): kept the shared state (%s); reset each "
            "rank's own state (%s), reseeded from (seed, step %d, rank)",
            self.checkpoint["world_size"],
            self.rt.world_size,
            ", ".join(sorted(self.state)),
            ", ".join(reset),
            self.step,
        )
        seed_generators(self.seeds.torch(self.step))
        return None

    def open(self, total_steps: int) -> Path:
        """Collective: create the run directory, its config.yaml and the metrics sinks.

        A resumed run drops what the interrupted one wrote past the checkpoint (metrics rows,
        TensorBoard events, step checkpoints): its curves go on from the checkpoint, monotone.
        """
        self.dir = open_run_dir(self.rt, self.cfg)
        self.checkpointer = Checkpointer(self.dir, self.cfg.keep_last)
        self.logger = MetricsLogger(self.dir, self.cfg, False, total_steps=total_steps)  # rank 0's below
        if self.rt.is_main:
            with self._writing():
                prepare_run_dir(self.dir, self.cfg)
                if self.resumed:
                    for p in self.checkpointer.drop_after(self.step):
                        log.info("dropped %s: past the resumed checkpoint's step %d", p.name, self.step)
                    self.checkpointer.point_latest_at(Path(self.cfg.resume))
                self.logger = MetricsLogger(
                    self.dir, self.cfg, True, total_steps=total_steps, start_step=self.step, resumed=self.resumed
                )
        self._settle_disk_full()
        self.split.take()  # the time split starts here: building models and envs is start-up
        return self.dir

    def log(self, step: int, metrics: dict[str, float]) -> None:
        """Record global metrics at ``step`` and move the progress bar (every rank calls)."""
        # What the stop-signal checks have cost so far: time in their collectives (about the same
        # on every rank, collectives end together), here rank 0's.
        metrics = {**metrics, "time/stop_check_s": self._stop_check.reduce_s, **self._time_split()}
        if self._full is None:  # after a write that did not fit, no row more: the file ends whole
            with self._writing():
                self.logger.log(step, metrics)
            if self.rt.world_size == 1:
                self._settle_disk_full()  # no peer to tell; with peers, the next row's reduction does
        self.last_step = step
        evaluated = {k: v for k, v in metrics.items() if k.startswith(("eval/", "val/", "test/"))}
        if evaluated:
            self.last_eval = (step, evaluated)
        # time/global_fps -> "fps", time/samples_per_s -> "samples/s"
        label = self.rate_key.rsplit("/", 1)[-1].replace("global_", "").replace("_per_", "/")
        self.logger.progress(step, metrics.get(self.rate_key), label)

    def _time_split(self) -> dict[str, float]:
        """Collective: the seconds per phase since the last row, mean over ranks, as
        ``time/<phase>_s`` for every phase this run has used so far."""
        window = self.split.take()
        if self.rt.world_size > 1:
            # Whether a rank's write did not fit rides on this reduction: no collective of its own per row.
            window = self.rt.all_reduce_mean({**window, DISK_FULL_KEY: float(self._full is not None)})
            if window.pop(DISK_FULL_KEY) > 0:
                self._settle_disk_full()
        for k, v in window.items():
            self.split_totals[k] += v
        return {f"time/{k}_s": v for k, v in window.items() if self.split_totals[k] > 0}

    def evaluate(
        self,
        make_eval_env: Callable[[int, int], Any],
        act: Callable[[Any], torch.Tensor],
        extra_keys: tuple[str, ...] = (),
    ) -> dict[str, float]:
        """Collective: ``eval_episodes`` episodes split over the ranks (:func:`ddprl.evaluate.evaluate`,
        seeded from ``seed``, shown on the progress bar); the global means as ``eval/<name>``.
        ``make_eval_env(num_envs, seed)``: an env of the VecEnv contract (a multi-agent one too);
        ``act``: its observations to actions."""
        from ddprl.evaluate import evaluate

        cfg = cast("RLConfig", self.cfg)  # an RL job's: only RL loops evaluate episodes
        with self.split.phase("eval"):
            result = evaluate(
                self.rt,
                make_eval_env,
                act,
                cfg.eval_episodes,
                cfg.seed,
                extra_keys,
                progress=self.eval_progress,
            )
        return {f"eval/{k}": v for k, v in result.items()}

    def eval_progress(self, done: int, episodes: int) -> None:
        """``progress`` for :func:`ddprl.evaluate.evaluate`: the bar says which episode runs."""
        self.logger.evaluating(done, episodes)

    def progress(self, step: int) -> None:
        """Move the progress bar to ``step`` without logging a row (rank 0 draws it)."""
        self.logger.progress(step)

    def improves(self, score: float | None) -> bool:
        """Whether ``score`` (a global eval metric; None: no evaluation now) beats every earlier
        one, so that a checkpoint saved now becomes ``best.pt``. Loops save a checkpoint whenever
        it does, whatever ``checkpoint_freq`` says: best.pt is always the best evaluation."""
        if score is None:
            return False
        if self.best is None:
            return score == score  # not NaN
        return score > self.best["score"] if self.score_mode == "max" else score < self.best["score"]

    def save(
        self,
        step: int,
        state: dict[str, Any],
        counters: dict[str, Any] | None = None,
        own: dict[str, Any] | None = None,
        score: float | None = None,
    ) -> Path:
        """Collective checkpoint: ``state`` shared (identical on all ranks), ``own`` this rank's.

        ``score`` (a global eval metric, or None when there was no evaluation) makes this
        checkpoint ``best.pt`` when it beats every earlier one.
        """
        is_best = score is not None and self.improves(score)
        if is_best:
            self.best = {"score": float(score), "step": int(step)}
        payload = {
            "algo": self.cfg.algo,
            "step": int(step),
            "config": to_dict(self.cfg),
            "counters": dict(counters or {}),
            "state": state,
            "best": self.best,
        }
        path = self.checkpointer.dir / f"step_{step}.pt"
        with self.split.phase("checkpoint"):
            with self._writing():
                path = self.checkpointer.save(self.rt, step, payload, {"rng": rng_state(), **(own or {})}, is_best)
            self._settle_disk_full()
        return path

    def save_own_file(self, data: dict[str, Any], path: Path) -> None:
        """Write this rank's own file of the next checkpoint (its replay buffer) atomically; call
        :meth:`save` after it, where a full disk met here is said by every rank together."""
        with self._writing():
            save_atomically(data, path)

    @contextlib.contextmanager
    def _writing(self) -> Iterator[None]:
        """This rank's writes: the first that does not fit is kept, not raised, until every rank
        learns of it (:meth:`_settle_disk_full`), so that no rank waits alone in a collective."""
        try:
            yield
        except DiskFull as e:
            if self._full is None:
                self._full = e

    def _settle_disk_full(self) -> None:
        """Collective: when a write of any rank did not fit, every rank closes its sinks and raises
        :class:`DiskFull` with that rank's message (rank 0 prints it; exit code 74)."""
        mine = None if self._full is None else str(self._full)
        every = [mine] if self.rt.world_size == 1 else self.rt.all_gather_object(mine)
        failed = [(rank, m) for rank, m in enumerate(every) if m]
        if not failed:
            return
        self.logger.abandon()
        rank, message = failed[0]
        if hosts := hosts_if_several(self.rt.hosts):  # every host says it: name the one whose disk is full
            message = f"rank {rank} on {hosts[rank]}: {message}"
        where = f"run_dir={self.dir}" if self.dir is not None else "run_dir=<this run's directory>"
        raise DiskFull(
            f"{message}; free some space, then the same command with resume=auto {where} continues "
            "from the last checkpoint"
        )

    def step_boundary(
        self,
        step: int,
        save: Callable[[float | None], Any],
        score: float | None = None,
        due: bool = False,
        last: bool = False,
    ) -> None:
        """Collective, at the end of every iteration of a loop: ``save(score)`` writes a checkpoint
        when one is ``due`` (``checkpoint_freq``), at the ``last`` step, when ``score`` (an
        evaluation now, else None) beats every earlier one, or when a stop signal reached some
        rank; after that save every rank leaves together (:meth:`preempted`, exit code 75)."""
        preempted = not last and self.stop_requested()
        if due or last or preempted or self.improves(score):
            save(score)
        if preempted:
            self.preempted(step)

    def stop_requested(self) -> bool:
        """Collective, called by every rank at every step boundary: whether a signal (SIGTERM,
        SIGUSR1) reached any rank. Most calls return at once; about once a second the ranks
        compare flags (``ddprl.runtime.preemption``). When True, save a checkpoint at this
        step and call :meth:`preempted`."""
        return self._stop_check()

    def step_cost_changes(self) -> None:
        """Called by every rank at the same step, where its steps turn costlier (learning starts
        after cheap steps of random acting or warm-up): :meth:`stop_requested` then compares the
        flags at the next step boundary and measures its cadence on the new steps, so that a
        signal waits about a second, not a window sized for the cheap steps."""
        self._stop_check.restart()

    def preempted(self, step: int) -> NoReturn:
        """Collective, after the checkpoint of ``step`` is saved: close the sinks, leave together
        and raise :class:`Preempted` (the job's exit code is then 75)."""
        self.close()
        # also the barrier: no rank leaves (and lets a launcher kill the others) before rank 0 wrote
        self._settle_disk_full()
        if self.rt.first_on_host:  # said on every host of the job
            log.warning(
                "stopped by %s at step %d, checkpoint saved: run the same command with resume=auto "
                "run_dir=%s to continue",
                self._stop_check.signal,
                step,
                self.dir,
            )
        raise Preempted(f"stopped by {self._stop_check.signal} at step {step}")

    def finish(self) -> None:
        """End of training (every rank calls): close the sinks; rank 0 prints the summary block."""
        self.close()
        self._settle_disk_full()
        if self.rt.is_main:
            print(self.summary(), flush=True)

    def summary(self) -> str:
        """What a finished job did and how to look at it: one block, its last line the run directory."""
        wall = time.perf_counter() - self._started
        what = f"algo={self.cfg.algo}" + (f" task={self.cfg.task}" if getattr(self.cfg, "task", None) else "")
        lines = [
            f"ddprl: done: {what}, {self.last_step:,} {self.step_unit} on {self.rt.world_size} "
            f"{'process' if self.rt.world_size == 1 else 'processes'} in {_duration(wall)}"
        ]
        if self.last_eval is not None:
            step, values = self.last_eval
            shown = ", ".join(
                f"{k} {v:.4g}" for k, v in values.items() if not k.endswith(("_std", "episodes", "num_samples"))
            )
            lines.append(f"  final evaluation {shown} (step {step:,})")
        if self.best is not None:
            lines.append(
                f"  best evaluation  {self.score_name} {self.best['score']:.4g} at step {self.best['step']:,}: "
                f"{self.dir / 'checkpoints' / 'best.pt'}"
            )
        lines.extend(self._time_lines())
        # checkpoint=<run directory>: eval and play take its best.pt, else latest.pt
        if self.next_line is not None:
            lines.append(f"  next             {self.next_line.format(best=self.dir / 'checkpoints' / 'best.pt')}")
        else:
            lines.append(f"  evaluate         ddprl eval checkpoint={self.dir}")
            if registry.get(self.cfg.algo, self.cfg.engine).load_actor is not None:  # a policy to watch
                lines.append(f"  watch            ddprl play checkpoint={self.dir} video={self.cfg.algo}.gif")
        lines.append(f"  plot             ddprl plot {self.dir}")
        lines.append(f"run directory: {self.dir}")
        return "\n".join(lines)

    def _time_lines(self) -> list[str]:
        """Where the logged time went (mean over ranks), the largest share first; a hint when
        collectives lead."""
        split = shares(self.split_totals)
        if not split:
            return []
        lines = [f"  time             {split}"]
        if max(self.split_totals, key=self.split_totals.get) == "collective":
            lines.append(
                "  collectives take the largest share: fewer, larger updates per rank cut it "
                "(sync_freq, batch_size, envs per rank; docs/scaling.md)"
            )
        return lines

    def close(self) -> None:
        """Close the sinks (rank 0 flushes its files: a full disk is kept for :meth:`_settle_disk_full`)."""
        with self._writing():
            self.logger.close()
