"""Record one episode of a trained agent to a GIF or MP4 (``ddprl eval ... video=out.gif``).

The environment must offer ``render_rgb()`` (DMC tasks do, given an OpenGL backend such as
``MUJOCO_GL=egl``; Snake always can). GIFs need only imageio; MP4 also needs ``imageio-ffmpeg``
(``pip install "ddprl[video]"``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ddprl.errors import UsageError

FPS = 30


def _writer_for(path: Path):
    import imageio.v2 as imageio

    suffix = path.suffix.lower()
    if suffix == ".gif":
        return imageio.get_writer(path, mode="I", duration=1000 / FPS, loop=0)
    if suffix == ".mp4":
        try:
            import imageio_ffmpeg  # noqa: F401
        except ImportError:
            raise UsageError(f"video={path}: writing .mp4 needs imageio-ffmpeg (pip install imageio-ffmpeg); "
                             "or use a .gif path") from None
        return imageio.get_writer(path, fps=FPS, macro_block_size=1)
    raise UsageError(f"video={path}: use a .gif or .mp4 file name")


@torch.no_grad()
def record_video(actor: Any, path: str | Path, seed: int, max_steps: int = 1000) -> Path:
    """Run ``actor`` (an :class:`~ddprl.evaluate.Actor`) for one episode (at most ``max_steps``
    agent steps) in a fresh env seeded ``seed``, writing every frame to ``path``.

    >>> record_video(actor, "walker.gif", seed=1)            # doctest: +SKIP
    """
    path = Path(path)
    env = actor.make_env(1, seed)
    try:
        if not hasattr(env, "render_rgb"):
            raise UsageError(f"video: this task's environment cannot render frames ({type(env).__name__} "
                             "has no render_rgb); videos work for DeepMind Control tasks and task=snake")
        obs = env.reset(seed=seed)
        first = env.render_rgb()  # raises a UsageError naming MUJOCO_GL when nothing can render
        path.parent.mkdir(parents=True, exist_ok=True)
        writer = _writer_for(path)
        try:
            writer.append_data(first)
            for _ in range(max_steps):
                obs, _, terminated, truncated, _ = env.step(actor.act(obs))
                writer.append_data(env.render_rgb())
                if bool((terminated | truncated)[0]):
                    break
        finally:
            writer.close()
    finally:
        env.close()
    return path
