"""Record episodes of a trained agent to a GIF or MP4 (``ddprl play ... video=out.gif``, also
``ddprl eval ... video=``).

Every kind of task draws frames: Gymnasium tasks through ``render_mode="rgb_array"`` (classic
control, Box2D, MuJoCo), DMC, Snake, the multi-agent tasks and the JAX engine's tasks (see
``ddprl.jax.pictures``). MuJoCo-based tasks need an OpenGL backend: on a machine without a
display ``MUJOCO_GL=egl`` is taken unless set otherwise. Each frame shows the step and the
return so far. GIFs need only imageio; MP4 also needs ``imageio-ffmpeg``
(``pip install "ddprl[video]"``).
"""

from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ddprl.errors import UsageError

FPS = 30  # frames per second of a task that states no rate of its own
SUFFIXES = (".gif", ".mp4")


def headless_rendering() -> None:
    """Defaults for the libraries that draw frames, each set only where the user set nothing.

    Called before any of them starts: pygame prints its banner at import, and SDL reads its
    drivers at ``pygame.init()`` (which Gymnasium's classic control and Box2D call to draw);
    MuJoCo picks its OpenGL backend at import.
    """
    defaults = {
        "PYGAME_HIDE_SUPPORT_PROMPT": "1",  # pygame's "Hello from the pygame community" line
        # pygame.init() opens audio and a display although frames are drawn offscreen: without
        # a sound card ALSA prints eight lines, without a session "XDG_RUNTIME_DIR is invalid".
        "SDL_AUDIODRIVER": "dummy",
        "SDL_VIDEODRIVER": "dummy",
    }
    # MuJoCo's default backend (GLFW) needs an X or Wayland display on Linux; EGL renders
    # without one (NVIDIA, Mesa). Elsewhere (macOS) GLFW needs none.
    if sys.platform.startswith("linux") and not any(
        os.environ.get(k) for k in ("DISPLAY", "WAYLAND_DISPLAY", "PYOPENGL_PLATFORM")
    ):
        defaults["MUJOCO_GL"] = "egl"
    for key, value in defaults.items():
        os.environ.setdefault(key, value)


def check_video_path(path: str | Path) -> Path:
    """``path`` as a Path, or a UsageError when no video can be written there (checked before
    any model or env is made)."""
    path = Path(path)
    if path.suffix.lower() not in SUFFIXES:
        raise UsageError(f"video={path}: use a .gif or .mp4 file name")
    if path.suffix.lower() == ".mp4":
        try:
            import imageio_ffmpeg  # noqa: F401
        except ImportError:
            raise UsageError(
                f'video={path}: writing .mp4 needs imageio-ffmpeg (pip install "ddprl[video]"); or use a .gif path'
            ) from None
    if path.is_dir():
        raise UsageError(f"video={path} is a directory; give a file name ending in .gif or .mp4")
    return path


def _writer_for(path: Path, fps: float):
    import imageio.v2 as imageio

    if path.suffix.lower() == ".gif":
        # GIF delays are whole centiseconds: 50 fps (CartPole) is the fastest most viewers play.
        return imageio.get_writer(path, mode="I", duration=1000 / min(fps, 50), loop=0)
    return imageio.get_writer(path, fps=fps, macro_block_size=1)


def overlay(frame: np.ndarray, text: str) -> np.ndarray:
    """``frame`` with ``text`` in its top-left corner, white on a dark band (frames narrower
    than 120 pixels are returned as they are: the text would cover them)."""
    if frame.shape[1] < 120:
        return frame
    from PIL import Image, ImageDraw, ImageFont

    image = Image.fromarray(frame)
    draw = ImageDraw.Draw(image, "RGBA")
    try:
        font = ImageFont.load_default(size=max(11, frame.shape[0] // 28))
    except (TypeError, OSError):  # a Pillow without FreeType: its fixed bitmap font
        font = ImageFont.load_default()
    left, top, right, bottom = draw.textbbox((6, 4), text, font=font)
    draw.rectangle((0, 0, right + 6, bottom + 4), fill=(0, 0, 0, 140))
    draw.text((6, 4), text, fill=(255, 255, 255, 255), font=font)
    return np.asarray(image)


def _even(frame: np.ndarray) -> np.ndarray:
    """Pad to even height and width (H.264's 4:2:0 colour needs them; GIFs do not care)."""
    h, w = frame.shape[:2]
    if h % 2 == 0 and w % 2 == 0:
        return frame
    return np.pad(frame, ((0, h % 2), (0, w % 2), (0, 0)), mode="edge")


@torch.no_grad()
def record_video(
    actor: Any, path: str | Path, seed: int, max_steps: int = 1000, fps: float | None = None, label: str = ""
) -> Path:
    """Run ``actor`` (an :class:`~ddprl.evaluate.Actor`) for one episode (at most ``max_steps``
    agent steps) in a fresh env seeded ``seed``, writing a frame of every state to ``path``.

    ``fps``: the video's rate (default: the task's own where it states one, else 30);
    ``label``: text put before the step and return on every frame.

    >>> record_video(actor, "walker.gif", seed=1)            # doctest: +SKIP
    """
    path = check_video_path(path)
    env, obs, first = _first_frame(actor, seed)
    try:
        fps = fps or getattr(env, "render_fps", None) or FPS
        path.parent.mkdir(parents=True, exist_ok=True)
        writer = _writer_for(path, fps)
        prefix = f"{label}  " if label else ""
        with warnings.catch_warnings():
            # The MP4 writer starts ffmpeg (fork, then exec at once), which JAX's fork hook warns
            # about in a process that imported JAX; nothing of JAX runs in the child.
            warnings.filterwarnings("ignore", message=r"os\.fork\(\) was called", category=RuntimeWarning)
            _write_episode(env, actor, obs, first, writer, max_steps, prefix, path.suffix.lower() == ".mp4")
    finally:
        env.close()
    return path


def check_frames(actor: Any, seed: int) -> None:
    """Draw the first frame of an env of ``actor``'s task, or raise the UsageError that says why
    none can be drawn: for a caller that plays other episodes before it records one (``ddprl eval
    ... video=``), so that a video that cannot be made is refused before them."""
    env, _, _ = _first_frame(actor, seed)
    env.close()


def _first_frame(actor: Any, seed: int) -> tuple[Any, torch.Tensor, np.ndarray]:
    """A fresh env of ``actor``'s task made to draw, reset with ``seed``, and that state's frame;
    a UsageError saying why when nothing can draw (MUJOCO_GL, pygame), the env then closed."""
    from ddprl.envs import rendering

    headless_rendering()
    with rendering("rgb_array"):
        env = actor.make_env(1, seed)
    try:
        if not hasattr(env, "render_rgb"):
            raise UsageError(f"video: this task's environment ({type(env).__name__}) cannot draw frames")
        obs = env.reset(seed=seed)
        return env, obs, env.render_rgb()
    except BaseException:
        env.close()
        raise


def _write_episode(
    env: Any, actor: Any, obs: torch.Tensor, first: np.ndarray, writer: Any, max_steps: int, prefix: str, mp4: bool
) -> None:
    """Frames of one episode of ``env`` (reset, its first state drawn as ``first``) to
    ``writer``, each with the step and the return so far; closes ``writer``."""

    def add(frame: np.ndarray, text: str) -> None:
        picture = overlay(np.asarray(frame, dtype=np.uint8), prefix + text)
        writer.append_data(_even(picture) if mp4 else picture)

    try:
        frame, total = first, 0.0
        for step in range(max_steps + 1):
            add(frame, f"step {step}  return {total:.2f}")
            if step == max_steps:
                break
            obs, reward, terminated, truncated, _ = env.step(actor.act(obs))
            total += float(reward.reshape(-1)[0])
            if bool((terminated | truncated).reshape(-1)[0]):
                # Envs reset in the step that ends an episode: drawn now they would show the next
                # episode's start. The last state drawn stays, with the final return.
                add(frame, f"step {step + 1}  return {total:.2f}  (end)")
                break
            frame = env.render_rgb()
    finally:
        writer.close()
