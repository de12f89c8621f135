"""The speed benchmarks' command lines: output paths are checked before a benchmark runs."""

import layer_speed
import module_speed
import pytest


@pytest.mark.parametrize("main, command", [(layer_speed.main, ["--quick", "--which", "linear"]),
                                           (module_speed.main, [])])
def test_a_json_path_that_cannot_be_written_is_refused_before_the_benchmark(tmp_path, capsys, main, command):
    for bad, match in ((tmp_path, "is a directory; expected a file"),
                       (tmp_path / "no" / "r.json", "does not exist; expected a file in an existing directory")):
        with pytest.raises(SystemExit) as e:
            main([*command, "--json", str(bad)])
        assert e.value.code == 2 and match in capsys.readouterr().err
