"""A MuJoCo environment's OpenGL backend (chosen by ``MUJOCO_GL``) failing: told in one line that names the
backend and what to set, never as the task's fault. Without a display, MuJoCo's default backend (glfw) cannot
make a context, and ``MUJOCO_GL=osmesa`` without the OSMesa library fails as soon as gymnasium imports
MuJoCo's renderer, which a MuJoCo environment does even when it is not rendered."""

from __future__ import annotations

import contextlib
import os
import warnings

# the modules a backend's failure comes from: PyOpenGL, MuJoCo's GL contexts, gymnasium's MuJoCo renderer
_BACKEND_MODULES = ("OpenGL", "mujoco.rendering", "mujoco.osmesa", "mujoco.egl", "mujoco.glfw", "mujoco.cgl",
                    "gymnasium.envs.mujoco.mujoco_rendering")
_WHAT_TO_SET = ("without a display, set MUJOCO_GL=egl (a GPU's or Mesa's EGL) or MUJOCO_GL=osmesa (software; "
                "needs the OSMesa library, e.g. apt-get install libosmesa6)")


def _raised_in(error: BaseException):
    """The module of every frame ``error`` (and the errors it came from) passed through."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        frame = error.__traceback__
        while frame is not None:
            yield frame.tb_frame.f_globals.get("__name__") or ""
            frame = frame.tb_next
        error = error.__cause__ or error.__context__


def rendering_failure(error: BaseException, env_id: str) -> str | None:
    """The one line that explains ``error`` if MuJoCo's OpenGL backend raised it (else None): which backend
    ``MUJOCO_GL`` chose, the backend's own words, and which values to set."""
    if not any(name == m or name.startswith(f"{m}.") for name in _raised_in(error) for m in _BACKEND_MODULES):
        return None
    chosen = os.environ.get("MUJOCO_GL")
    backend = f"MUJOCO_GL={chosen}" if chosen else "MUJOCO_GL is not set, so MuJoCo uses glfw, which needs a display"
    said = (str(error).splitlines() or [""])[0][:200]
    return (f"{env_id}: MuJoCo's OpenGL backend could not start ({backend}; {type(error).__name__}: {said}); "
            f"{_WHAT_TO_SET}")


@contextlib.contextmanager
def rendering_errors(env_id: str):
    """Inside: a failure of MuJoCo's OpenGL backend is a ValueError of one line (:func:`rendering_failure`), and
    glfw's own warnings are not shown (without a display it warns twice before it fails, which the error says)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", module="glfw")
        try:
            yield
        except Exception as e:
            failure = rendering_failure(e, env_id)
            if failure:
                raise ValueError(failure) from e
            raise


__all__ = ["rendering_errors", "rendering_failure"]
