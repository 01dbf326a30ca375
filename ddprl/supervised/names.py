"""The task names a supervised job may give: a shipped task, ``module:function`` (the user's own
code), or the label of a job started from Python. ``SupervisedConfig`` checks its ``task`` here,
before anything is imported; ``ddprl.supervised.tasks`` makes the task.
"""

from __future__ import annotations

import difflib
import re

from ddprl.errors import UsageError

SHIPPED = {
    "digits": "ddprl.supervised.tasks:digits",
    "breast_cancer": "ddprl.supervised.tasks:breast_cancer",
    "graph_energy": "ddprl.supervised.graph:graph_energy",
}
USER_TASK = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*")
# The task label of a job started from Python (Trainer): its factories are not named anywhere.
PYTHON_TASK = "python"


def is_user_task(name: str) -> bool:
    """``module:function``: the user's code, imported only when named on the command line."""
    return bool(USER_TASK.fullmatch(name))


def check_task_name(name: str) -> None:
    if name in SHIPPED or is_user_task(name):
        return
    if name == PYTHON_TASK:
        raise UsageError(
            "task=python is the label of a job started from Python (ddprl.supervised.Trainer); "
            "from the command line name a shipped task or module:function"
        )
    near = difflib.get_close_matches(name, list(SHIPPED), n=3, cutoff=0.6)
    hint = f" (did you mean {', '.join(near)}?)" if near else ""
    raise UsageError(
        f"unknown supervised task {name!r}{hint}; shipped: {', '.join(SHIPPED)}, "
        f"or module:function returning a ddprl.supervised.Task"
    )
