"""A config or search-space file is read safely: no alias expansion (a billion laughs ends at once), no key
given twice, no file beyond 1 MiB (nor /dev/zero), each refused in one line naming the file."""

import os

import pytest
import yaml

from nesgpu.cli import main
from nesgpu.train import TrainConfig
from nesgpu.train.setup.yaml_file import read_yaml_file

LAUGHS = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{n}: &{n} [{', '.join(['*' + p] * 9)}]\n" for p, n in zip("abcdefgh", "bcdefghi")) + "steps: *i\n"


def test_a_billion_laughs_is_refused_at_its_first_alias_before_anything_is_built(tmp_path, monkeypatch):
    path = tmp_path / "laughs.yaml"
    path.write_text(LAUGHS)
    built = []
    construct = yaml.constructor.BaseConstructor.construct_document  # every loader builds a document's values here
    monkeypatch.setattr(yaml.constructor.BaseConstructor, "construct_document",
                        lambda self, node: built.append(node) or construct(self, node))
    with pytest.raises(ValueError, match=r"laughs.yaml is not valid YAML .*uses an alias.*\(line 2\)") as refused:
        TrainConfig.read_yaml(path)
    assert isinstance(refused.value.__cause__, yaml.composer.ComposerError)  # the alias check, while composing
    assert built == []  # no value was built from the document, let alone its 9**9 expansion


def test_a_key_given_twice_is_refused(tmp_path):
    path = tmp_path / "twice.yaml"
    path.write_text("steps: 5\nlr: 0.1\nsteps: 50\n")
    with pytest.raises(ValueError, match=r"sets 'steps' twice; keep one \(line 3\)"):
        TrainConfig.read_yaml(path)
    nested = tmp_path / "space.yaml"
    nested.write_text("lr: {low: 1.0e-4, low: 0.1}\n")
    with pytest.raises(ValueError, match="sets 'low' twice"):
        read_yaml_file(nested, "space file")


def test_a_huge_file_or_dev_zero_is_refused_without_reading_it(tmp_path):
    path = tmp_path / "big.yaml"
    path.write_text("# " + "x" * (1 << 20) + "\nsteps: 5\n")
    with pytest.raises(ValueError, match="larger than 1 MiB"):
        TrainConfig.read_yaml(path)
    if os.path.exists("/dev/zero"):
        with pytest.raises(ValueError, match="/dev/zero is larger than 1 MiB"):
            TrainConfig.read_yaml("/dev/zero")


def test_a_plain_config_still_reads(tmp_path):
    path = tmp_path / "ok.yaml"
    path.write_text("steps: 5\nlr: 1e-3\nhidden: [8, 8]\n")
    assert TrainConfig.read_yaml(path) == {"steps": 5, "lr": 1e-3, "hidden": [8, 8]}


def test_from_the_cli_a_bad_file_is_one_line(tmp_path, capsys):
    path = tmp_path / "laughs.yaml"
    path.write_text(LAUGHS)
    with pytest.raises(SystemExit) as exit:
        main(["train", "--config", str(path)])
    assert exit.value.code != 0
    err = [line for line in capsys.readouterr().err.strip().splitlines() if not line.startswith("usage:")]
    assert len(err) == 1 and "alias" in err[0] and "Traceback" not in err[0]
