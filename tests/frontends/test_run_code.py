"""A run directory is data: the code its config.json names (a gym:module:Env-v0 task's module, reward functions),
installed or not, is imported by eval, play and train --resume only with --trust-run-code; python -m nesgpu
imports what the nesgpu script does; a user's own env module is found in the working directory by both, and the
working directory is off the import path after; a config.json that is a FIFO is one error, not a hang."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from nesgpu.tasks.user_code import import_module, named_code
from nesgpu.train import TrainConfig, train

pytest.importorskip("gymnasium")

SCRIPT = str(Path(sys.executable).with_name("nesgpu"))
ENV = dict(os.environ, OMP_NUM_THREADS="1")
MARK = "import pathlib\npathlib.Path(__file__).with_name('imported-' + __name__).touch()\n"
HOLD = """import gymnasium

class Hold(gymnasium.Env):
    observation_space = gymnasium.spaces.Box(-10.0, 10.0, (1,))
    action_space = gymnasium.spaces.Box(-1.0, 1.0, (1,))

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.x, self.t = self.np_random.uniform(-1, 1, 1).astype("float32"), 0
        return self.x, {}

    def step(self, action):
        self.x = (self.x + 0.3 * action.clip(-1, 1)).astype("float32")
        self.t += 1
        return self.x, -float(abs(self.x[0])), False, self.t >= 5, {}

gymnasium.register("Hold-v0", entry_point=Hold)
"""


def nesgpu(*args, cwd, module=True):
    command = [sys.executable, "-m", "nesgpu"] if module else [SCRIPT]
    return subprocess.run([*command, *args], cwd=cwd, capture_output=True, text=True, timeout=300, env=ENV)


@pytest.fixture(scope="module")
def gym_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("runcode") / "run"
    train(TrainConfig(task="gym:CartPole-v1", steps=1, population=4, out=str(out), device="cpu", log="none"),
          log=lambda *a, **k: None)
    return out


def with_config(run: Path, where: Path, **changes) -> Path:
    """A copy of ``run`` at ``where`` whose config.json has ``changes``."""
    where.mkdir()
    for file in run.iterdir():
        if file.is_file():
            (where / file.name).write_bytes(file.read_bytes())
    config = json.loads((run / "config.json").read_text())
    (where / "config.json").write_text(json.dumps({**config, **changes}))
    return where


def test_only_builtin_tasks_and_plain_gym_ids_name_no_code():
    assert named_code({"task": "cartpole"}) == [] and named_code({"task": "gym:CartPole-v1"}) == []
    assert named_code({"task": "gym:venv.__main__:CartPole-v1", "reward": "this:s, rw.py:f"}) == [
        ("the task gym:venv.__main__:CartPole-v1", "venv.__main__"), ("the reward function this:s", "this"),
        ("the reward function rw.py:f", "rw.py")]
    with pytest.raises(ValueError, match="reward: expected module:function names as text; got list"):
        named_code({"reward": ["this:s"]})


@pytest.mark.parametrize("command", [["eval"], ["play"], ["train", "--steps", "2", "--resume"]])
def test_a_run_naming_an_installed_module_as_its_gym_env_is_refused(gym_run, tmp_path, command):
    run = with_config(gym_run, tmp_path / "run", task="gym:this:CartPole-v1")
    (tmp_path / "cwd").mkdir()
    done = nesgpu(*command, str(run), cwd=tmp_path / "cwd")
    assert done.returncode == 2 and "Beautiful is better" not in done.stdout + done.stderr, done.stderr[-2000:]
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert f"{run / 'config.json'} names the task gym:this:CartPole-v1, which imports this" in done.stderr
    assert "--trust-run-code" in done.stderr


def test_a_reward_module_not_found_from_here_says_where_it_is_looked_for(gym_run, tmp_path):
    run = with_config(gym_run, tmp_path / "run", reward="no_such_rewards_module:f")
    done = nesgpu("eval", str(run), cwd=tmp_path)
    assert done.returncode != 0 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert ("imports no_such_rewards_module (not found from this directory: a module is imported from the working "
            "directory, so run from where the run started)") in done.stderr


def test_python_m_nesgpu_inside_a_run_directory_imports_none_of_its_files(gym_run, tmp_path):
    run = with_config(gym_run, tmp_path / "run")
    for name in ("gymnasium", "tabulate"):
        (run / f"{name}.py").write_text(MARK)
    done = nesgpu("eval", ".", cwd=run)
    assert done.returncode == 0 and json.loads(done.stdout)["task"] == "gym:CartPole-v1", done.stderr[-2000:]
    assert not list(run.glob("imported-*"))


@pytest.mark.parametrize("module", [False, True], ids=["script", "python-m"])
def test_an_env_module_of_the_working_directory_is_found_and_leaves_the_import_path(tmp_path, module):
    (tmp_path / "my_envs.py").write_text(HOLD)
    (tmp_path / "tabulate.py").write_text(MARK)  # torch imports tabulate at exit: the installed one, not this
    done = nesgpu("train", "--task", "gym:my_envs:Hold-v0", "--steps", "1", "--population", "4", "--out", "hold",
                  cwd=tmp_path, module=module)
    assert done.returncode == 0 and json.loads(done.stdout)["task"] == "gym:my_envs:Hold-v0", done.stderr[-2000:]
    refused = nesgpu("eval", "hold", cwd=tmp_path, module=module)  # the run names it: even your own, asked first
    assert refused.returncode == 2 and "--trust-run-code" in refused.stderr, refused.stderr[-2000:]
    trusted = nesgpu("eval", "hold", "--trust-run-code", cwd=tmp_path, module=module)
    assert trusted.returncode == 0 and json.loads(trusted.stdout)["task"] == "gym:my_envs:Hold-v0"
    assert f"importing my_envs ({tmp_path / 'my_envs.py'})" in trusted.stderr, trusted.stderr[-2000:]
    assert not (tmp_path / "imported-tabulate").exists()


def test_a_module_is_imported_from_the_working_directory_for_that_import_only(tmp_path, monkeypatch):
    (tmp_path / "own_module_55.py").write_text("VALUE = 55\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    before = list(sys.path)
    assert import_module("own_module_55", "test").VALUE == 55 and sys.path == before
    with pytest.raises(ValueError, match="test: cannot import 'no_such_module_55' .*ModuleNotFoundError"):
        import_module("no_such_module_55", "test")
    assert sys.path == before


def test_a_config_json_that_is_a_fifo_is_one_error_not_a_hang(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    os.mkfifo(run / "config.json")
    for command in (["eval", "run"], ["play", "run"], ["train", "--resume", "run", "--steps", "2"]):
        done = nesgpu(*command, cwd=tmp_path)  # today's code blocks on the FIFO: the timeout fails the test
        assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr[-2000:]
        assert f"{Path('run') / 'config.json'} is not a regular file (it is a FIFO)" in done.stderr
    helped = nesgpu("train", "--resume", "run", "--help", cwd=tmp_path)
    assert helped.returncode == 0 and "--trust-run-code" in helped.stdout, helped.stderr[-2000:]
