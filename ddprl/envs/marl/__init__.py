"""``make_marl_env``: one rank's cooperative multi-agent env, whatever the task's package.

Four families, told apart by the task's name so that a missing package can be named:

- Level-Based Foraging (``lbforaging``): its Gymnasium ids, ``Foraging-8x8-2p-2f-coop-v3``,
  ``Foraging-2s-10x10-3p-3f-v3``, and the 5-to-9-food ids registered by ``marl.lbf``.
- RWARE (``rware``): its Gymnasium ids, ``rware-tiny-2ag-v2``, ``rware-small-4ag-hard-v2``.
- MPE (``mpe2``): the module names, ``simple_spread_v3``, ``simple_speaker_listener_v4``.
- VMAS (``vmas``): ``vmas/<scenario>``, ``vmas/balance``, ``vmas/navigation``.
- SMAX (``jaxmarl``): ``smax/<scenario>``, ``smax/3m``, ``smax/2s3z``, ``smax/5m_vs_6m``.
- SMAC (``smac`` and StarCraft II, neither on a package index): ``sc2/<map>``, ``sc2/3m``.

LBF, RWARE, MPE and SMAC are Python envs stepped in one loop on the CPU (``marl.pyloop``); VMAS runs
batched in torch on ``device``, SMAX batched in JAX on the same device. All follow
``marl.base``: the same MAObs, team reward, terminated/truncated split and same-step auto-reset.
"""

from __future__ import annotations

import difflib
import importlib.util
import re
from typing import Any

import torch

from ddprl.envs.marl.base import MAObs, MultiAgentVecEnv
from ddprl.errors import UsageError

__all__ = ["make_marl_env", "check_marl_task", "marl_task_names", "MAObs", "MultiAgentVecEnv"]

# family: (name pattern, module to import, what to pip install)
_FAMILIES = {
    "lbf": (r"Foraging.*", "lbforaging", "lbforaging"),
    "rware": (r"rware.*", "rware", "rware"),
    "mpe": (r"(mpe/)?(simple\w*|collect_treasure)_v\d+", "mpe2", "mpe2"),
    "vmas": (r"vmas/.*", "vmas", "vmas"),
    "smax": (r"smax/.*", "jaxmarl", "jaxmarl"),
    "sc2": (r"sc2/.*", "smac", "git+https://github.com/oxwhirl/smac.git (and StarCraft II)"),
}
_EXAMPLES = "Foraging-8x8-2p-2f-coop-v3, rware-tiny-2ag-v2, simple_spread_v3, vmas/balance or smax/3m"


def _family(task: str) -> str | None:
    return next((f for f, (pattern, _, _) in _FAMILIES.items() if re.fullmatch(pattern, task)), None)


def _installed(family: str) -> bool:
    return importlib.util.find_spec(_FAMILIES[family][1]) is not None


def _family_names(family: str) -> list[str]:
    if family in ("lbf", "rware"):
        import gymnasium as gym

        importlib.import_module("ddprl.envs.marl.lbf" if family == "lbf" else "ddprl.envs.marl.rware_env")
        prefix = "Foraging" if family == "lbf" else "rware"
        return [name for name in gym.registry if name.startswith(prefix)]
    if family == "mpe":
        from ddprl.envs.marl.mpe import mpe_task_names

        return mpe_task_names()
    if family == "smax":
        from ddprl.envs.marl.smax import smax_task_names

        return smax_task_names()
    if family == "sc2":
        from ddprl.envs.marl.smac import smac_task_names

        return smac_task_names()
    from ddprl.envs.marl.vmas_env import vmas_task_names

    return vmas_task_names()


def marl_task_names() -> list[str]:
    """Every task name ``make_marl_env`` accepts with the packages installed here."""
    return [name for family in _FAMILIES if _installed(family) for name in _family_names(family)]


def check_marl_task(task: str) -> None:
    """Raise a UsageError (one line) when ``task`` cannot be made here: the package to install
    when the name is a known family's, else up to 3 near matches."""
    family = _family(task)
    if family is not None and not _installed(family):
        raise UsageError(f"{task!r} needs the {_FAMILIES[family][1]} package: pip install {_FAMILIES[family][2]}")
    if family == "sc2":
        from ddprl.envs.marl.smac import check_smac

        check_smac()  # the game too
    names = _family_names(family) if family is not None else marl_task_names()
    if task.removeprefix("mpe/") in names:
        return
    near = difflib.get_close_matches(task, names, n=3, cutoff=0.6)
    hint = f" (did you mean {', '.join(near)}?)" if near else ""
    raise UsageError(f"unknown multi-agent task {task!r}{hint}; use e.g. {_EXAMPLES}")


def make_marl_env(
    task: str, num_envs: int, seed: int, device: str | torch.device = "cpu", **kwargs: Any
) -> MultiAgentVecEnv:
    """``num_envs`` copies of ``task`` on ``device``; env ``i`` seeded ``seed + i`` (VMAS: one
    stream seeded ``seed`` for the batch). ``time_limit=`` sets the episode limit for every
    family; other kwargs go to the family's constructor and unknown ones are a UsageError.

    >>> env = make_marl_env("Foraging-8x8-2p-2f-coop-v3", num_envs=4, seed=0)
    >>> obs = env.reset()                                  # MAObs, obs.obs: (4, 2, 12)
    >>> obs, reward, terminated, truncated, info = env.step(torch.zeros(4, env.n_agents, dtype=torch.int64))
    """
    check_marl_task(task)
    family = _family(task)
    if kwargs.get("full_obs") and family != "smax":
        raise UsageError(
            f"{task} gives no full observation (an agent's view with unlimited sight): SMAX battles do, "
            "e.g. smax/3m, smax/5m_vs_6m"
        )
    if family == "vmas":
        from ddprl.envs.marl.vmas_env import VmasVecEnv

        return VmasVecEnv(task.removeprefix("vmas/"), num_envs, seed=seed, device=device, **kwargs)
    if family == "smax":
        from ddprl.envs.marl.smax import SmaxVecEnv

        return SmaxVecEnv(task.removeprefix("smax/"), num_envs, seed=seed, device=device, **kwargs)
    from ddprl.envs.marl.pyloop import PyLoopVecEnv

    if family == "lbf":
        from ddprl.envs.marl.lbf import LBFEnv as OneEnv
    elif family == "rware":
        from ddprl.envs.marl.rware_env import RwareEnv as OneEnv
    elif family == "sc2":
        from ddprl.envs.marl.smac import SMACEnv as OneEnv
    else:
        from ddprl.envs.marl.mpe import MPEEnv as OneEnv
    return PyLoopVecEnv([OneEnv(task, **kwargs) for _ in range(num_envs)], seed=seed, device=device)
