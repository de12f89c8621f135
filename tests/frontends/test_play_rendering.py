"""Filming a MuJoCo run on a machine without a display: one line that names MUJOCO_GL=egl|osmesa, never a
traceback, and never the task's fault."""

import ctypes.util
import os
import subprocess
import sys

import pytest

from nesgpu.tasks.rendering import rendering_errors, rendering_failure


def _headless(**env) -> dict:
    """This process's environment without a display or a MuJoCo backend, plus ``env``."""
    clean = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY", "MUJOCO_GL",
                                                               "PYOPENGL_PLATFORM")}
    return {**clean, "OMP_NUM_THREADS": "1", **env}


def _error_line(done) -> str:
    """The command's one error line: the last on stderr, after any warning of MuJoCo's model compiler."""
    assert done.returncode == 2 and "Traceback" not in done.stderr and "glfw:" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert [line for line in lines if line.startswith("nesgpu ")] == lines[-1:], done.stderr
    return lines[-1]


def _nesgpu(args, where, **env):
    return subprocess.run([sys.executable, "-m", "nesgpu", *args], cwd=where, env=_headless(**env),
                          capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def mujoco_run(tmp_path_factory):
    for package in ("mujoco", "gymnasium", "imageio_ffmpeg"):
        pytest.importorskip(package)
    where = tmp_path_factory.mktemp("headless")
    done = _nesgpu(["train", "--task", "gym:HalfCheetah-v5", "--steps", "1", "--population", "2",
                    "--eval-episodes", "1", "--out", "run", "--log", "none"], where)
    assert done.returncode == 0, done.stderr
    return where


def test_play_video_without_a_display_names_mujoco_gl_in_one_line(mujoco_run):
    done = _nesgpu(["play", "run", "--episodes", "1", "--video", "out.mp4"], mujoco_run)
    err = [_error_line(done)]
    assert "MUJOCO_GL is not set, so MuJoCo uses glfw, which needs a display" in err[0]
    assert "set MUJOCO_GL=egl" in err[0] and "MUJOCO_GL=osmesa" in err[0] and "unknown task" not in err[0]
    assert not (mujoco_run / "out.mp4").exists()


@pytest.mark.skipif(ctypes.util.find_library("OSMesa") is not None, reason="OSMesa is installed: osmesa works")
def test_a_missing_osmesa_is_not_blamed_on_the_task(mujoco_run):
    done = _nesgpu(["play", "run", "--episodes", "1", "--video", "out.mp4"], mujoco_run, MUJOCO_GL="osmesa")
    err = [_error_line(done)]
    assert "gym:HalfCheetah-v5: MuJoCo's OpenGL backend could not start (MUJOCO_GL=osmesa;" in err[0]
    assert "unknown task" not in err[0] and "MUJOCO_GL=egl" in err[0]


def _raise_from_module(module_name: str, error: Exception):
    """Raise ``error`` from a frame whose module is ``module_name``, as a backend's code would."""
    exec(compile("def fail(e):\n    raise e\n", "<backend>", "exec"), scope := {"__name__": module_name})
    scope["fail"](error)


def test_only_the_backends_errors_are_explained(monkeypatch):
    monkeypatch.setenv("MUJOCO_GL", "egl")
    with pytest.raises(ValueError, match=r"^Ant-v5: MuJoCo's OpenGL backend could not start \(MUJOCO_GL=egl; "
                                         r"RuntimeError: no EGL\); without a display, set MUJOCO_GL=egl"):
        with rendering_errors("Ant-v5"):
            _raise_from_module("OpenGL.raw.EGL._errors", RuntimeError("no EGL"))
    with pytest.raises(KeyError):  # the environment's own bug, raised as it is
        with rendering_errors("Ant-v5"):
            _raise_from_module("gymnasium.envs.mujoco.ant_v5", KeyError("qpos"))
    try:
        _raise_from_module("OpenGLish", RuntimeError("x"))
    except RuntimeError as e:
        assert rendering_failure(e, "Ant-v5") is None
