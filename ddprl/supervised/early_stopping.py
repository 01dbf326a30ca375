"""Early stopping on a globally reduced metric: one decision, the same on every rank.

The caller hands in a value that is already global (reduced over ranks); the loop lets rank 0
decide and broadcasts the decision, so no rank can stop while another waits in a collective.
"""

from __future__ import annotations

import math
from typing import Any


class EarlyStopping:
    """Stop after ``patience`` validations in a row that did not beat the best by more than ``min_delta``.

    >>> stopper = EarlyStopping(mode="min", patience=2)
    >>> [stopper.update(v) for v in (1.0, 0.9, 0.95, 0.91)]
    [False, False, False, True]
    """

    def __init__(self, mode: str = "min", patience: int = 0, min_delta: float = 0.0):
        if mode not in ("min", "max"):
            raise ValueError(f"mode={mode!r} is not min or max")
        self.mode, self.patience, self.min_delta = mode, patience, min_delta
        self.best: float | None = None
        self.bad_evals = 0
        self.stopped = False

    def improves(self, value: float) -> bool:
        """Whether ``value`` beats the best so far by more than ``min_delta`` (NaN never does)."""
        if math.isnan(value):
            return False
        if self.best is None:
            return True
        return value < self.best - self.min_delta if self.mode == "min" else value > self.best + self.min_delta

    def update(self, value: float) -> bool:
        """Record one validation's value; True when training should stop now."""
        if self.improves(value):
            self.best, self.bad_evals = float(value), 0
        else:
            self.bad_evals += 1
        self.stopped = self.patience > 0 and self.bad_evals >= self.patience
        return self.stopped

    def state_dict(self) -> dict[str, Any]:
        return {"best": self.best, "bad_evals": self.bad_evals, "stopped": self.stopped}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore best and count; ``stopped`` follows this instance's patience (resuming with a larger
        patience continues a run that had stopped)."""
        self.best, self.bad_evals = state["best"], int(state["bad_evals"])
        self.stopped = self.patience > 0 and self.bad_evals >= self.patience
