"""A model class defined in a user's script: saved from ``__main__`` when the script runs, loaded back from the
same script as a file (``--model own_defs.py:MyPolicy``); another class is still refused."""

import subprocess
import sys

import pytest

SCRIPT = '''
import torch
from torch import nn
from nesgpu.tasks import ClassificationTask
from nesgpu.train import TrainConfig, train

gen = torch.Generator().manual_seed(0)
x = torch.randn(120, 6, generator=gen)
y = (x[:, 0] > 0).long()
task = ClassificationTask(x[:80], y[:80], x[80:], y[80:], batch_size=16, name="own")


class MyPolicy(nn.Sequential):
    def __init__(self):
        super().__init__(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 2))


class OtherPolicy(MyPolicy):
    """The same parameter names as MyPolicy's: only the class tells them apart."""


if __name__ == "__main__":
    train(TrainConfig(steps=2, population=8, out="runs/own", log="none"), model=MyPolicy(), task=task)
'''


@pytest.fixture(scope="module")
def script_run(tmp_path_factory):
    """``python own_defs.py`` run in a directory of its own: it trains runs/own from its __main__.MyPolicy."""
    where = tmp_path_factory.mktemp("script")
    (where / "own_defs.py").write_text(SCRIPT)
    done = subprocess.run([sys.executable, "own_defs.py"], cwd=where, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    return where


def test_eval_loads_a_run_trained_from_a_script_with_the_scripts_class(script_run, monkeypatch, capsys):
    from nesgpu.cli import main

    monkeypatch.chdir(script_run)
    code = main(["eval", "runs/own", "--task", "own_defs.py:task", "--model", "own_defs.py:MyPolicy"])
    out = capsys.readouterr()
    assert code == 0 and "test_accuracy" in out.out, out.err


def test_another_class_of_the_script_is_still_refused(script_run, monkeypatch, capsys):
    from nesgpu.cli import main

    monkeypatch.chdir(script_run)
    with pytest.raises(SystemExit) as exit_info:
        main(["eval", "runs/own", "--task", "own_defs.py:task", "--model", "own_defs.py:OtherPolicy"])
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and len(err) == 1
    assert "were saved from a __main__.MyPolicy; got a own_defs.OtherPolicy" in err[0]


def test_a_run_trained_from_a_module_loads_into_the_same_class_run_as_a_script(script_run, tmp_path):
    """The other way round: trained with own_defs.MyPolicy, loaded by a script whose class is __main__.MyPolicy."""
    import nesgpu
    from nesgpu.tasks.user_code import load_object
    from nesgpu.train import TrainConfig, train

    policy, task = (load_object(f"{script_run / 'own_defs.py'}:{name}", "model") for name in ("MyPolicy", "task"))
    train(TrainConfig(steps=1, population=8, out=str(tmp_path / "run"), log="none"), model=policy(), task=task,
          log=lambda *a, **k: None)
    as_script = type("MyPolicy", (policy,), {"__module__": "__main__"})
    assert nesgpu.load_run(tmp_path / "run", model=as_script(), task=task).model is not None
    other = type("Renamed", (policy,), {"__module__": "__main__"})
    with pytest.raises(ValueError, match=r"saved from a own_defs.MyPolicy; got a __main__.Renamed"):
        nesgpu.load_run(tmp_path / "run", model=other(), task=task)
