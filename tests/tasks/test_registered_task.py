"""A task with an option of its own, written outside the package: its file plus one registration, made after
``nesgpu.train`` is imported. Its option is a flag of ``nesgpu train --task toy`` (in its --help, with its
default), a key of a YAML config and of config.json, an error under another task, and (declared so) an
option a resume cannot change."""

import json
import subprocess
import sys

from conftest import doc_section

TOY, REGISTRATION = (blocks[0] for blocks in doc_section("A task with an option of its own"))

DRIVER = """
import sys
sys.path.insert(0, {here!r})
import nesgpu.train  # the configuration first: the registry is read when a config is resolved
import nesgpu.tasks
from toy_task import SPEC
{registration}from nesgpu.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_a_task_with_an_option_is_its_own_file_plus_one_registry_line(tmp_path):
    (tmp_path / "toy_task.py").write_text(TOY)
    (tmp_path / "driver.py").write_text(DRIVER.format(here=str(tmp_path), registration=REGISTRATION))

    def nesgpu(*args):
        return subprocess.run([sys.executable, str(tmp_path / "driver.py"), "train", *args], capture_output=True,
                              text=True, timeout=300, cwd=tmp_path)

    helped = nesgpu("--task", "toy", "--help")
    assert helped.returncode == 0 and "task toy options" in helped.stdout
    assert "--samples N" in helped.stdout and "(default: 16)" in helped.stdout
    run = tmp_path / "run"
    done = nesgpu("--task", "toy", "--samples", "5", "--log", "none", "--out", str(run))
    assert done.returncode == 0, done.stderr
    assert "toy samples 5" in done.stdout and json.loads((run / "config.json").read_text())["samples"] == 5
    (tmp_path / "toy.yaml").write_text("task: toy\nsamples: 7\nlog: none\n")
    from_yaml = nesgpu("--config", str(tmp_path / "toy.yaml"), "--out", str(tmp_path / "yaml_run"))
    assert from_yaml.returncode == 0, from_yaml.stderr
    assert json.loads((tmp_path / "yaml_run" / "config.json").read_text())["samples"] == 7
    resumed = nesgpu("--resume", str(run), "--steps", "3")
    assert resumed.returncode == 0 and "toy samples 5" in resumed.stdout, resumed.stderr
    changed = nesgpu("--resume", str(run), "--steps", "4", "--samples", "6")  # it defines the run, it says
    assert changed.returncode == 2 and "options that define the run differ from its checkpoint (samples: 5 -> 6)" \
        in changed.stderr
    bad = nesgpu("--task", "toy", "--samples", "0", "--print-config")
    assert bad.returncode == 2 and "toy: option 'samples' must be >= 1; got 0" in bad.stderr
    other = nesgpu("--task", "cartpole", "--samples", "5", "--print-config")
    assert other.returncode == 2 and "option 'samples' (= 5) applies to task 'toy', not to task 'cartpole'" in \
        other.stderr and "Traceback" not in other.stderr
