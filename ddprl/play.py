"""``ddprl play``: watch a trained agent in the terminal (or write its episodes to a GIF/MP4)."""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO

import torch

from ddprl.errors import UsageError
from ddprl.evaluate import episode_record


@torch.no_grad()
def play_terminal(actor: Any, episodes: int, fps: float, seed: int, out: TextIO = sys.stdout) -> list[dict[str, float]]:
    """Show ``episodes`` episodes frame by frame (one env, the actor's eval actions); returns their stats.

    Needs an environment that draws text: Snake, or a Gymnasium task with an ``"ansi"`` render
    mode. On a terminal each frame replaces the last; piped output gets the frames one after
    the other.
    """
    from ddprl.envs import rendering

    with rendering("ansi"):
        env = actor.make_env(1, seed)
    if not hasattr(env, "render_ascii"):
        task = getattr(env, "task", None)
        env.close()
        raise UsageError(
            f"play: {task or 'this task'} has no text picture for the terminal (task=snake has one); "
            "watch it as a video: add video=out.gif (or video=out.mp4)"
        )
    clear = "\033[H\033[2J" if out.isatty() else ""
    results = []
    obs = env.reset(seed=seed)
    for episode in range(1, episodes + 1):
        step = 0
        while True:
            out.write(f"{clear}{env.render_ascii(0)}\nepisode {episode}/{episodes}  step {step}\n")
            out.flush()
            if fps > 0:
                time.sleep(1.0 / fps)
            obs, _, terminated, truncated, info = env.step(actor.act(obs))
            step += 1
            if bool((terminated | truncated)[0]):
                stats = episode_record(info, 0, tuple(getattr(env, "extra_info_keys", ())))
                results.append(stats)
                out.write(" ".join(f"{k}={v:g}" for k, v in stats.items()) + "\n")
                break
    env.close()
    return results
