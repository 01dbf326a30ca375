"""When TD-MPC2 acts randomly, when it learns and how much, when it logs, evaluates and saves.

One :class:`Schedule` per run, identical on every rank: it counts *global* agent steps (summed
over ranks) and takes every decision from them, so every rank makes the same number of
updates, and joins the same collectives, whatever its own episodes do (docs/distributed.md,
invariant 1). docs/tdmpc2.md ("Schedule, and what N ranks change", "Checkpoints and resume")
explains the choices:

- The first ``seed_steps`` global steps act randomly. Its default, world_size x max(1000, 5 L)
  (``TDMPC2Config.seed_steps_for``), gives every rank the paper's max(1000, 5 L) random steps,
  so that every rank holds whole episodes before the first update. When they end, each rank makes one
  update per local transition collected so far, at once (the paper's pretraining burst), then
  ``updates_per_step`` per local transition. Updates start only when every rank's buffer can
  be sampled: the loop asks (a collective) while :attr:`Schedule.may_start_learning`.
- ``sync_freq = k``: one optimizer step per k micro-batches; what is owed carries to the next step.
- Resuming without the replay buffers, every rank refills for ``seed_steps`` global steps
  without updating: with random actions if the checkpoint came before the burst (seeding
  starts over), with the agent's own actions after it (and no second burst). With the
  buffers, seeding goes on where it was, or updates go on at once.

Example (one rank, one env, 4 seed steps)::

    s = Schedule(steps=6, num_envs=1, local_num_envs=1, seed_steps=4, updates_per_step=1, sync_freq=1)
    while not s.done:
        random = s.acts_randomly          # True for the first 4 steps
        s.advance()
        if s.may_start_learning:          # at step 4: every rank's buffer sampleable? then
            s.start_learning()            # the burst: 4 micro-batches owed
        n = s.take_updates()              # 0, 0, 0, 4, 1, 1
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ddprl.algos.common import crossed

if TYPE_CHECKING:
    from ddprl.algos.tdmpc2.config import TDMPC2Config


@dataclass
class Schedule:
    """The loop's counters and the decisions taken from them (see the module docstring).

    Build it with :meth:`for_run`; the fields after ``evaluates`` are the counters.
    """

    steps: int  # global agent steps to take in all
    num_envs: int  # global steps per agent step: world_size x local_num_envs
    local_num_envs: int
    seed_steps: int  # global steps of random actions before learning (from the start of the run)
    updates_per_step: int  # micro-batches per local transition once learning
    sync_freq: int  # micro-batches per optimizer step
    log_freq: int = 0
    eval_freq: int = 0
    checkpoint_freq: int = 0
    evaluates: bool = False  # eval_episodes > 0: the last step evaluates too
    # -- counters --------------------------------------------------------------------------
    step: int = 0  # global agent steps taken
    updates: int = 0  # optimizer steps made
    pretrained: bool = False  # the burst after seeding is done (saved: never owed twice)
    random_until: int | None = None  # global step from which actions are the agent's (None: seed_steps)
    learn_from: int | None = None  # global step from which updates may start (None: seed_steps)
    local_steps: int = 0  # transitions this rank collected in this process, plus those restored
    learning: bool = False  # updates have started: every agent step owes some
    micro_due: int = 0  # micro-batches owed by this rank (the same on every rank)

    def __post_init__(self) -> None:
        if self.random_until is None:
            self.random_until = self.seed_steps
        if self.learn_from is None:
            self.learn_from = self.seed_steps

    @classmethod
    def for_run(
        cls,
        cfg: TDMPC2Config,
        world_size: int,
        episode_length: int,
        step: int = 0,
        counters: dict[str, Any] | None = None,
        restored: int | None = None,
    ) -> Schedule:
        """The schedule of a fresh run (``counters`` None), or of one resumed at global ``step``
        with the checkpoint's ``counters``; ``restored``: the transitions each rank's replay
        buffer got back (None: the buffers did not come back, so every rank refills)."""
        local_num_envs = cfg.local_num_envs(world_size)
        s = cls(
            steps=cfg.steps,
            num_envs=world_size * local_num_envs,
            local_num_envs=local_num_envs,
            seed_steps=cfg.seed_steps_for(episode_length, world_size),
            updates_per_step=cfg.updates_per_step,
            sync_freq=cfg.sync_freq,
            log_freq=cfg.log_freq,
            eval_freq=cfg.eval_freq,
            checkpoint_freq=cfg.checkpoint_freq,
            evaluates=cfg.eval_episodes > 0,
        )
        if counters is None:
            return s
        s.step, s.updates, s.pretrained = step, counters["updates"], counters["pretrained"]
        if restored is None:
            s.learn_from = step + s.seed_steps  # refill: seed_steps global steps without updates
        else:
            s.local_steps = restored  # the burst, if still owed, counts them
            s.learning = s.pretrained
            # Micro-batches owed under sync_freq > 1 (fewer than sync_freq; none were drawn yet):
            # owed still, so that the resumed run makes the optimizer steps the whole run makes.
            # Checkpoints from before this key owe none.
            s.micro_due = counters.get("micro_due", 0) if s.learning else 0
        # After the burst the agent acts (also while refilling); before it, seeding goes on
        # (buffers back) or starts over (refilling).
        s.random_until = step if s.pretrained else s.learn_from
        return s

    # -- the questions the loop asks -------------------------------------------------------

    @property
    def done(self) -> bool:
        """All steps taken: the step just taken was the last one."""
        return self.step >= self.steps

    @property
    def acts_randomly(self) -> bool:
        """Whether the next agent step takes random actions (seeding)."""
        return self.step < self.random_until

    def advance(self) -> None:
        """One agent step taken on every rank (``local_num_envs`` transitions on each)."""
        self.step += self.num_envs
        self.local_steps += self.local_num_envs
        if self.learning:
            self.micro_due += self.local_num_envs * self.updates_per_step

    @property
    def may_start_learning(self) -> bool:
        """Updates may start now: the loop asks every rank whether its buffer can be sampled,
        and calls :meth:`start_learning` when all can (else asks again next step)."""
        return not self.learning and self.step >= self.learn_from

    def start_learning(self) -> int:
        """Learning starts; returns the micro-batches of the pretraining burst, owed now: one
        per local transition collected so far, or none when the burst was made before a resume."""
        self.micro_due = 0 if self.pretrained else self.local_steps * self.updates_per_step
        self.learning = self.pretrained = True
        return self.micro_due

    def take_updates(self) -> int:
        """The optimizer steps to make now (``sync_freq`` micro-batches each), counted as made."""
        n = self.micro_due // self.sync_freq
        self.micro_due -= n * self.sync_freq
        self.updates += n
        return n

    @property
    def log_due(self) -> bool:
        return crossed(self.step, self.num_envs, self.log_freq) or self.done

    @property
    def eval_due(self) -> bool:
        return self.evaluates and (crossed(self.step, self.num_envs, self.eval_freq) or self.done)

    @property
    def checkpoint_due(self) -> bool:
        """A checkpoint by ``checkpoint_freq`` or at the end (preemption and best scores add theirs)."""
        return crossed(self.step, self.num_envs, self.checkpoint_freq) or self.done

    def counters(self) -> dict[str, Any]:
        """What a checkpoint keeps; :meth:`for_run` takes it back. The micro-batches still owed
        count only when the replay buffers come back: refilling owes none."""
        return {"updates": self.updates, "pretrained": self.pretrained, "micro_due": self.micro_due}
