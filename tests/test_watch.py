"""Watching trained agents: ``ddprl play``/``eval`` videos of Gymnasium tasks (classic control,
MuJoCo), the terminal view, ``checkpoint=<run directory>``, and no library noise on the way.

Real runs through the CLI, kept tiny (a few hundred steps, one rank): what is checked is the
picture, not the policy.
"""

from __future__ import annotations

import importlib.util
import io
import subprocess
import sys

import numpy as np
import pytest
import torch
from conftest import cli_env, run_cli

from ddprl.checkpoint import checkpoint_in
from ddprl.envs import make_env, rendering
from ddprl.errors import UsageError
from ddprl.evaluate import Actor

TINY = ["world_size=1", "num_envs=2", "n_steps=64", "batch_size=64", "epochs=1", "steps=256", "progress=false"]


def frames_of(path):
    import imageio.v2 as imageio

    return [np.asarray(f)[..., :3] for f in imageio.mimread(path)]


def colours(frame: np.ndarray) -> int:
    """How many different colours ``frame`` (H, W, 3) has."""
    rgb = frame.astype(np.int32)
    return len(np.unique((rgb[..., 0] << 16) | (rgb[..., 1] << 8) | rgb[..., 2]))


def only_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr[-3000:]
    return lines[0]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A CartPole run that evaluated (best.pt and latest.pt) and a Pendulum run that did not
    (latest.pt only)."""
    root = tmp_path_factory.mktemp("runs")
    cartpole = run_cli(["train", *TINY, "eval_episodes=1", "eval_freq=128", f"run_dir={root / 'cartpole'}"], cwd=root)
    assert cartpole.returncode == 0, cartpole.stderr[-3000:]
    pendulum = run_cli(
        ["train", "task=Pendulum-v1", *TINY, "eval_episodes=0", f"run_dir={root / 'pendulum'}"], cwd=root
    )
    assert pendulum.returncode == 0, pendulum.stderr[-3000:]
    assert (root / "cartpole" / "checkpoints" / "best.pt").exists()
    assert not (root / "pendulum" / "checkpoints" / "best.pt").exists()
    return root


@pytest.mark.parametrize(
    "task,size,picked", [("cartpole", (400, 600, 3), "best.pt"), ("pendulum", (500, 500, 3), "latest.pt")]
)
@pytest.mark.slow
def test_play_writes_a_gif_of_a_gymnasium_task_from_its_run_directory(runs, tmp_path, task, size, picked):
    gif = tmp_path / f"{task}.gif"
    res = run_cli(["play", f"checkpoint={runs / task}", f"video={gif}"], cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.strip() == f"wrote {gif}"
    # The one stderr line says which checkpoint the directory gave; nothing from pygame/SDL/ALSA.
    assert only_line(res.stderr) == f"ddprl: checkpoint {runs / task / 'checkpoints' / picked}"
    frames = frames_of(gif)
    assert len(frames) > 5 and all(f.shape == size and f.dtype == np.uint8 for f in frames)
    assert all(colours(f) > 2 for f in frames[::10])  # drawings, not blank frames
    assert any(not np.array_equal(frames[1], f) for f in frames[2:])  # the system moves
    # The overlay: a dark band with light text in the top-left corner of a light background.
    corner, middle = frames[0][:12, :60], frames[0][-40:, :60]
    assert corner.mean() < 200 < middle.mean() and corner.max() > 200


@pytest.mark.skipif(
    importlib.util.find_spec("imageio_ffmpeg") is None, reason="writing .mp4 needs imageio-ffmpeg (the video extra)"
)
@pytest.mark.slow
def test_play_writes_an_mp4(runs, tmp_path):
    import imageio.v2 as imageio

    mp4 = tmp_path / "pendulum.mp4"
    res = run_cli(["play", f"checkpoint={runs / 'pendulum'}", f"video={mp4}", "fps=20"], cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    reader = imageio.get_reader(mp4)
    frames = [f for f in reader]
    assert reader.get_meta_data()["fps"] == 20
    assert len(frames) == 201  # 200 steps (Pendulum's time limit): 200 states + the final return
    assert frames[0].shape == (500, 500, 3) and frames[0].std() > 5


@pytest.mark.slow
def test_eval_takes_a_run_directory(runs, tmp_path):
    for given, picked in [
        (runs / "cartpole", "best.pt"),
        (runs / "cartpole" / "checkpoints", "best.pt"),
        (runs / "pendulum", "latest.pt"),
    ]:
        res = run_cli(["eval", f"checkpoint={given}", "episodes=1"], cwd=tmp_path)
        assert res.returncode == 0, res.stderr[-3000:]
        assert f"ddprl: checkpoint {given.parent if given.name == 'checkpoints' else given}" in res.stderr
        assert picked in res.stderr and "episodes=1" in res.stdout


@pytest.mark.parametrize("command", ["eval", "play"])
def test_a_directory_without_checkpoints_is_one_error_line(tmp_path, command):
    (tmp_path / "runs" / "x" / "checkpoints").mkdir(parents=True)
    res = run_cli([command, f"checkpoint={tmp_path / 'runs' / 'x'}"], cwd=tmp_path)
    assert res.returncode == 2
    line = only_line(res.stderr)
    assert line.startswith("ddprl: error: ") and "no best.pt or latest.pt in" in line


def test_play_without_video_on_a_task_without_text_names_video(runs, tmp_path):
    res = run_cli(["play", f"checkpoint={runs / 'cartpole' / 'checkpoints' / 'latest.pt'}"], cwd=tmp_path)
    assert res.returncode == 2 and res.stdout == ""
    line = only_line(res.stderr)
    assert line.startswith("ddprl: error: play: CartPole-v1 has no text picture") and "video=out.gif" in line


@pytest.mark.slow
def test_a_video_name_that_is_no_gif_or_mp4_is_refused_first(runs, tmp_path):
    res = run_cli(
        ["play", f"checkpoint={runs / 'cartpole' / 'checkpoints' / 'latest.pt'}", f"video={tmp_path / 'x.avi'}"],
        cwd=tmp_path,
    )
    assert res.returncode == 2
    assert only_line(res.stderr) == f"ddprl: error: video={tmp_path / 'x.avi'}: use a .gif or .mp4 file name"
    res = run_cli(["eval", f"checkpoint={runs / 'cartpole'}", "video=x.webm"], cwd=tmp_path)
    assert (
        res.returncode == 2
        and res.stderr.strip().splitlines()[-1] == "ddprl: error: video=x.webm: use a .gif or .mp4 file name"
    )


def test_eval_with_video_records_one_episode(runs, tmp_path):
    gif = tmp_path / "e.gif"
    res = run_cli(["eval", f"checkpoint={runs / 'cartpole'}", "episodes=1", f"video={gif}"], cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    assert len(frames_of(gif)) > 5


# -- MuJoCo (Gymnasium): an OpenGL backend chosen for a machine without a display ------------------


@pytest.fixture(scope="module")
def mujoco_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("mujoco")
    res = run_cli(
        [
            "train",
            "task=InvertedPendulum-v5",
            *TINY[:-2],
            "steps=128",
            "eval_episodes=0",
            "progress=false",
            f"run_dir={root / 'ip'}",
        ],
        cwd=root,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    return root / "ip"


@pytest.mark.slow
def test_mujoco_task_renders_headless(mujoco_run, tmp_path):
    gif = tmp_path / "ip.gif"
    env = {
        k: v for k, v in cli_env().items() if k not in ("MUJOCO_GL", "PYOPENGL_PLATFORM", "DISPLAY", "WAYLAND_DISPLAY")
    }
    res = subprocess.run(
        [sys.executable, "-m", "ddprl", "play", f"checkpoint={mujoco_run}", f"video={gif}"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if res.returncode == 2 and "cannot render InvertedPendulum-v5 with MUJOCO_GL=egl" in res.stderr:
        pytest.skip(f"no EGL rendering on this machine: {res.stderr.strip().splitlines()[-1]}")
    assert res.returncode == 0, res.stderr[-3000:]
    assert only_line(res.stderr).startswith("ddprl: checkpoint ")
    frames = frames_of(gif)
    assert len(frames) >= 3 and frames[0].shape == (480, 480, 3) and frames[0].std() > 5


def test_mujoco_without_a_backend_is_one_error_line(mujoco_run, tmp_path):
    # set here, not inherited: cli_env() keeps a MUJOCO_GL the developer's shell exports (egl would render)
    res = run_cli(
        ["play", f"checkpoint={mujoco_run}", f"video={tmp_path / 'ip.gif'}"],
        cwd=tmp_path,
        env={**cli_env(), "MUJOCO_GL": "disable"},
    )
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 2 and lines[0].startswith("ddprl: checkpoint "), res.stderr[-3000:]
    assert lines[1].startswith("ddprl: error: cannot render InvertedPendulum-v5 with MUJOCO_GL=disable")
    assert "set MUJOCO_GL=egl" in lines[1]


# -- pieces, in this process --------------------------------------------------------------------------


def test_checkpoint_in(tmp_path):
    ckpts = tmp_path / "run" / "checkpoints"
    ckpts.mkdir(parents=True)
    (ckpts / "latest.pt").write_bytes(b"x")
    assert checkpoint_in(tmp_path / "run") == ckpts / "latest.pt"
    (ckpts / "best.pt").write_bytes(b"x")
    assert checkpoint_in(tmp_path / "run") == ckpts / "best.pt"
    assert checkpoint_in(ckpts) == ckpts / "best.pt"
    assert checkpoint_in(tmp_path / "run", prefer=("latest.pt",)) == ckpts / "latest.pt"
    assert checkpoint_in(ckpts / "step_9.pt") == ckpts / "step_9.pt"  # files (and missing paths) as given
    (tmp_path / "other" / "checkpoints").mkdir(parents=True)
    with pytest.raises(UsageError, match=r"other: no latest.pt in .*other/checkpoints"):
        checkpoint_in(tmp_path / "other", prefer=("latest.pt",))


def test_gymnasium_envs_draw_only_when_made_for_it():
    plain = make_env("CartPole-v1", 1, seed=0)
    plain.reset()
    with pytest.raises(UsageError, match=r"rendering\('rgb_array'\)"):
        plain.render_rgb()
    plain.close()
    with rendering("rgb_array"):
        env = make_env("CartPole-v1", 2, seed=0)
    env.reset()
    frame = env.render_rgb(1)
    assert frame.shape == (400, 600, 3) and frame.dtype == np.uint8 and frame.std() > 5
    assert env.render_fps == 50 and not hasattr(env, "render_ascii")
    env.close()
    assert make_env("CartPole-v1", 1, seed=0).render_mode is None  # outside the block: no renderer


def test_terminal_view_of_a_gymnasium_text_task():
    """ddprl/SnakeGym-v0 draws "ansi" text: the terminal player shows it (random actions here)."""
    gen = torch.Generator().manual_seed(0)
    actor = Actor(
        lambda n, seed: make_env("ddprl/SnakeGym-v0", n, seed=seed, grid_size=5),
        lambda obs: torch.randint(0, 4, (obs.shape[0],), generator=gen),
    )
    from ddprl.play import play_terminal

    out = io.StringIO()
    stats = play_terminal(actor, episodes=1, fps=0, seed=3, out=out)
    assert len(stats) == 1 and stats[0]["length"] >= 1
    assert out.getvalue().count("+-----+") >= 2 and "episode 1/1  step 0" in out.getvalue()


def test_gymnax_tasks_without_gymnasium_pictures_draw():
    pytest.importorskip("gymnax")
    from ddprl.jax.envs import make_jax_env
    from ddprl.jax.vec import JaxVecEnv

    for task, shape in [
        ("gymnax/Breakout-MinAtar", (320, 320, 3)),
        ("gymnax/FourRooms-misc", (312, 312, 3)),
        ("gymnax/Reacher-misc", (320, 320, 3)),
    ]:
        env = make_jax_env(task)
        vec = JaxVecEnv(env, 1, seed=0)
        vec.reset(seed=0)
        frame = vec.render_rgb()
        assert frame.shape == shape and frame.dtype == np.uint8 and colours(frame) > 2
    bandit = JaxVecEnv(make_jax_env("gymnax/SimpleBandit-bsuite"), 1, seed=0)
    bandit.reset(seed=0)
    with pytest.raises(UsageError, match="has no scene to draw"):
        bandit.render_rgb()


@pytest.mark.skipif(
    importlib.util.find_spec("imageio_ffmpeg") is None, reason="writing .mp4 needs imageio-ffmpeg (the video extra)"
)
def test_mp4_of_a_jax_task_warns_of_nothing(tmp_path):
    """The MP4 writer starts ffmpeg by fork and exec, which JAX's fork hook warns about."""
    pytest.importorskip("gymnax")
    import warnings

    from ddprl.jax.envs import make_jax_env
    from ddprl.jax.vec import JaxVecEnv
    from ddprl.video import record_video

    env = make_jax_env("gymnax/FourRooms-misc")
    actor = Actor(lambda n, seed: JaxVecEnv(env, n, seed), lambda obs: torch.zeros(obs.shape[0], dtype=torch.long))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        path = record_video(actor, tmp_path / "rooms.mp4", seed=0, max_steps=5)
    assert [str(w.message)[:60] for w in caught if "fork" in str(w.message)] == []
    import imageio.v2 as imageio

    frames = [f for f in imageio.get_reader(path)]
    assert len(frames) == 6 and frames[0].shape == (312, 312, 3)  # 5 steps: 6 states
