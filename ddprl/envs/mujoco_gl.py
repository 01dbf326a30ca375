"""MuJoCo's OpenGL backend, chosen by ``MUJOCO_GL`` (egl, osmesa, glfw, disable): the one line that
says it cannot draw, and what to do, wherever that is found (importing mujoco, drawing a frame)."""

from __future__ import annotations

import os
from types import ModuleType

from ddprl.errors import UsageError


def mujoco_gl() -> str:
    """The backend asked for, as the user wrote it."""
    return os.environ.get("MUJOCO_GL", "(unset)")


def what_to_do() -> str:
    """The way out for the backend chosen now: install it, or take the other headless one."""
    chosen = os.environ.get("MUJOCO_GL", "").lower()
    if chosen == "osmesa":
        way = "install OSMesa (e.g. apt install libosmesa6) or set MUJOCO_GL=egl (NVIDIA or Mesa EGL)"
    elif chosen == "egl":
        way = "install EGL (NVIDIA's driver, or Mesa's libegl1) or set MUJOCO_GL=osmesa"
    else:
        way = "set MUJOCO_GL=egl (NVIDIA or Mesa EGL) or MUJOCO_GL=osmesa"
    return way + " before starting ddprl"


def reason(e: BaseException) -> str:
    """``e`` in a few words: its type and first line."""
    return f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]}"


def cannot_render(task: str, why: str) -> UsageError:
    """The error for a frame of ``task`` that MuJoCo could not draw (``why``: :func:`reason`)."""
    return UsageError(f"cannot render {task} with MUJOCO_GL={mujoco_gl()} ({why}); {what_to_do()}")


def import_mujoco() -> ModuleType:
    """``mujoco``, or a UsageError naming MUJOCO_GL when the backend it names fails to load: mujoco
    loads it on import, so no MuJoCo task can start then (OSMesa missing ends in an AttributeError of
    PyOpenGL). An ImportError (mujoco not installed) is the caller's to explain."""
    try:
        import mujoco
    except ImportError:
        raise
    except Exception as e:
        raise UsageError(
            f"MUJOCO_GL={mujoco_gl()}: mujoco cannot load this OpenGL backend ({reason(e)}); {what_to_do()}"
        ) from None
    return mujoco
