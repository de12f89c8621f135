"""A write that fails says why, in the words of the OS: a full disk is "No space left on device", a file-size
limit (``ulimit -f``) is "File too large", and Ctrl-C while the command starts is one line."""

import os
import signal
import subprocess
import sys

import pytest
import torch

from nesgpu.cli import main
from nesgpu.train.storage import checkpoint

ARGS = ["train", "--steps", "2", "--population", "8", "--hidden", "8"]


def test_a_full_disk_while_saving_a_checkpoint_says_so(tmp_path, monkeypatch, capsys):
    def full_disk(state, f):
        f.write(b"x" * 100)
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 3008 vs 2900")
    monkeypatch.setattr(torch, "save", full_disk)
    monkeypatch.setattr(checkpoint.shutil, "disk_usage", lambda path: type("usage", (), {"free": 0})())
    with pytest.raises(SystemExit) as stop:
        main([*ARGS, "--out", str(tmp_path / "r")])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert stop.value.code == 1 and "unexpected pos" not in err
    assert err.startswith(f"nesgpu train: error: No space left on device ({tmp_path / 'r' / 'checkpoint'})")
    assert not list((tmp_path / "r").glob(".checkpoint.tmp-*"))  # the half-written checkpoint is gone


@pytest.mark.skipif(sys.platform == "win32", reason="resource limits are POSIX")
def test_a_file_size_limit_says_file_too_large(tmp_path):
    code = ("import resource, sys; resource.setrlimit(resource.RLIMIT_FSIZE, (150_000, resource.RLIM_INFINITY)); "
            "from nesgpu.cli import main; sys.exit(main(sys.argv[1:]))")
    args = [*ARGS[:-1], "512", "--out", str(tmp_path / "r"), "--log", "none"]
    done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=600)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert "File too large: the process may write files of at most 150000 bytes (ulimit -f)" in done.stderr


# ``python -m nesgpu``, held at the start of the parser's imports (torch, the commands) until the test says go
HELD_AT_THE_IMPORTS = """import runpy, sys
from nesgpu import cli
build = cli.build_parser
def held(argv):
    print("importing", flush=True)
    sys.stdin.readline()
    return build(argv)
cli.build_parser = held
runpy.run_module("nesgpu", run_name="__main__", alter_sys=True)
"""


def test_ctrl_c_while_the_command_starts_is_one_line():
    # SIGINT as a terminal delivers it (a shell's background job would inherit it ignored)
    process = subprocess.Popen([sys.executable, "-c", HELD_AT_THE_IMPORTS, *ARGS, "--out", os.devnull + "-never"],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        assert process.stdout.readline() == "importing\n"
        process.send_signal(signal.SIGINT)  # while the imports run
        err = process.communicate("go\n", timeout=300)[1]
    finally:
        process.kill()
    assert process.returncode == 130 and err.strip() == "nesgpu: interrupted"


def test_an_old_copy_that_cannot_be_removed_is_named(tmp_path, monkeypatch):
    (tmp_path / "hf.prev").mkdir()  # left by an earlier write that could not remove it (read-only files)

    def refuse(path, *args, **kwargs):
        if kwargs.get("ignore_errors"):
            return
        raise PermissionError(13, "Permission denied", str(path))
    monkeypatch.setattr(checkpoint.shutil, "rmtree", refuse)
    with pytest.raises(OSError, match=r"cannot remove .*hf\.prev, the old copy an earlier write left \(Permission "
                                      r"denied\); make it writable"):
        checkpoint.write_directory(tmp_path / "hf", lambda tmp: (tmp / "a").write_text("new"))
    monkeypatch.undo()
    (tmp_path / "hf.prev").rmdir()
    (tmp_path / "hf").mkdir()
    monkeypatch.setattr(checkpoint.shutil, "rmtree", refuse)
    with pytest.warns(UserWarning, match="the old copy of hf could not be removed"):
        checkpoint.write_directory(tmp_path / "hf", lambda tmp: (tmp / "a").write_text("new"))
    assert (tmp_path / "hf" / "a").read_text() == "new"


def test_ctrl_c_inside_a_late_import_is_one_line(tmp_path, monkeypatch, capsys):
    import nesgpu.frontends.train_cli as train_cli

    def import_interrupted(args):  # what numpy does with a KeyboardInterrupt during its import
        try:
            os.kill(os.getpid(), signal.SIGINT)
        except KeyboardInterrupt:
            raise RecursionError("maximum recursion depth exceeded while calling a Python object") from None
    monkeypatch.setattr(train_cli, "run_train", import_interrupted)  # main's parser is built after this
    before = signal.getsignal(signal.SIGINT)  # Python's default, or SIG_IGN under `nohup ... &`
    with pytest.raises(SystemExit) as stop:
        main([*ARGS, "--out", str(tmp_path / "r")])
    assert stop.value.code == 130 and capsys.readouterr().err.strip() == "nesgpu train: interrupted"
    assert signal.getsignal(signal.SIGINT) is before  # main put the handler back

