"""The command line's one-line warnings say who raised them."""

import io

import pytest

from nesgpu.cli import show_warning, warning_source


@pytest.mark.parametrize("filename, source", [
    ("mujoco", "mujoco"),  # MuJoCo's C library, as nesgpu.tasks.gym raises its messages
    ("/venv/lib/python3.11/site-packages/gymnasium/envs/mujoco/mujoco_env.py", "gymnasium"),
    ("/venv/lib/python3.11/site-packages/nesgpu/train/loop.py", "nesgpu"),
    ("/home/me/nesgpu/src/nesgpu/train/loop.py", "nesgpu"),  # an editable install
    ("/usr/lib/python3/dist-packages/torch/serialization.py", "torch"),
    ("/venv/lib/python3.11/site-packages/six.py", "six"),
])
def test_a_warning_is_labelled_by_who_raised_it(filename, source):
    assert warning_source(filename) == source


def test_a_mujoco_message_reads_as_mujocos():
    out = io.StringIO()
    show_warning("compiler attribute 'settotalmass' is deprecated", UserWarning, "mujoco", 0, file=out)
    assert out.getvalue() == "mujoco: warning: compiler attribute 'settotalmass' is deprecated\n"


def test_the_version_answers_without_importing_torch():
    import subprocess
    import sys

    code = "import sys; from nesgpu.cli import main; main(['--version']); print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and done.stdout.split() == ["nesgpu", __import__("nesgpu").__version__, "False"]


@pytest.mark.parametrize("args", [["train", "--reward-s", "1"], ["train", "--ste", "3"], ["eval", "--dev", "cpu", "x"],
                                  ["tune", "--tria", "2"], ["compare", "--time-b", "5"], ["check", "--model", "m", "--direc", "2"],
                                  ["play", "--epis", "2", "x"]])
def test_no_parser_takes_a_prefix_of_a_flag(args, capsys):
    from nesgpu.cli import build_parser

    with pytest.raises(SystemExit) as exit:
        build_parser().parse_args(args)
    err = capsys.readouterr().err
    assert exit.value.code == 2 and "unrecognized arguments" in err
    assert len(err.strip().splitlines()) == 1, err  # a mistake is one line, without argparse's usage


@pytest.mark.parametrize("args", [[], ["trian"], ["train", "--strategy", "nosuch"], ["train", "--strategy", "nosuch",
                                                                                     "--help"]])
def test_a_command_line_mistake_is_one_line(args):
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "nesgpu", *args], capture_output=True, text=True, timeout=600)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "error: " in done.stderr and "(--help lists the options)" in done.stderr and not done.stdout


def test_a_value_that_starts_with_a_dash_gets_the_way_to_pass_it(capsys):
    from nesgpu.cli import build_parser

    with pytest.raises(SystemExit):
        build_parser(["train"]).parse_args(["train", "--steps", "-5x"])
    err = capsys.readouterr().err
    assert "write it as --steps=VALUE" in err
    with pytest.raises(SystemExit):
        build_parser(["train"]).parse_args(["train", "--steps=-5x"])
    assert "invalid int value: '-5x'" in capsys.readouterr().err


def test_python_m_nesgpu_exits_130_after_an_interrupt_cut_a_string_exec(tmp_path):
    """CPython ends a ``python -m`` process with SIGINT when a KeyboardInterrupt cut any string ``exec``
    (a dataclass built during an import), even one main() caught: the interrupted run's one line and status
    130 must stand."""
    import os
    import subprocess
    import sys

    (tmp_path / "interrupted_main.py").write_text(
        "import runpy, sys\nimport nesgpu.cli\n\n"
        "def main():\n"
        "    try:\n"
        "        exec('raise KeyboardInterrupt', {})\n"
        "    except KeyboardInterrupt:\n"
        "        print('nesgpu train: interrupted', file=sys.stderr)\n"
        "        return 130\n\n"
        "nesgpu.cli.main = main\n"
        "runpy.run_module('nesgpu', run_name='__main__')\n")
    done = subprocess.run([sys.executable, "-m", "interrupted_main"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=600, env=dict(os.environ, PYTHONPATH=str(tmp_path)))
    assert done.returncode == 130 and done.stderr == "nesgpu train: interrupted\n", (done.returncode, done.stderr)
