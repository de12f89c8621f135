"""benchmarks/layer_speed.py on tiny sizes: structure of the results, ratio consistency, its command line. No timing
checks."""

import json
import math

import pytest
import torch

import layer_speed as bench
from layer_speed import main

LINEAR = [(8, 8), (4, 8)]
CONV = [(4, 4, (3, 3), (6, 6)), (8, 4, (1, 1), (1, 1))]
TINY = dict(device="cpu", population=8, linear_sizes=LINEAR, conv_sizes=CONV, linear_repeats=2, conv_repeats=2,
            warmup=1, naive_rows=4)


@pytest.fixture(scope="module")
def results():
    return bench.run("all", **TINY)


def test_time_call_returns_median_ms_and_counts_calls():
    calls = []
    ms = bench.time_call(lambda: calls.append(1), repeats=3, warmup=2, device="cpu")
    assert len(calls) == 5
    assert isinstance(ms, float) and 0 <= ms < 1e3


def test_rows_match_the_seed_tables(results):
    linear, conv = results["tables"]["linear"], results["tables"]["conv"]
    assert list(linear["ms"]) == [label for label, _, _ in bench.LINEAR_ROWS] + ["Base", "Naive"]
    assert list(conv["ms"]) == [label for label, _, _ in bench.CONV_ROWS] + ["Base", "Naive"]
    assert "SparsePerturbedLinear (k=2)" in linear["ms"] and "PermutedConv2d(out_sparsity=.1)" in conv["ms"]
    assert linear["sizes"] == ["(8, 8)", "(4, 8)"]
    assert conv["sizes"] == ["(4, 4, (3, 3), (6, 6))", "(8, 4, (1, 1), (1, 1))"]
    assert bench.size_label(bench.CONV_SIZES[0]) == "(16, 16, (3, 3), (64, 64))"


def test_every_cell_is_a_positive_time(results):
    for table in results["tables"].values():
        for cells in table["ms"].values():
            assert list(cells) == table["sizes"]
            assert all(math.isfinite(v) and v > 0 for v in cells.values())


def test_ratios_are_consistent(results):
    for table in results["tables"].values():
        ms = table["ms"]
        for row, cells in ms.items():
            for size, t in cells.items():
                assert table["speedup_vs_naive"][row][size] == pytest.approx(ms["Naive"][size] / t)
                assert table["time_vs_base"][row][size] == pytest.approx(t / ms["Base"][size])
        for size in table["sizes"]:
            assert table["speedup_vs_naive"]["Naive"][size] == pytest.approx(1.0)
            assert table["time_vs_base"]["Base"][size] == pytest.approx(1.0)
            assert table["time_vs_base"]["Naive"][size] == pytest.approx(table["speedup_vs_naive"]["Base"][size])


def test_noise_memory_matches_the_noise_tensors(results):
    mib = results["tables"]["linear"]["noise_mib"]
    assert "Base" not in mib and "Naive" not in mib
    # PerturbedLinear (out 4, in 8): D x out x in weight noise + D x out bias noise, float32
    assert mib["PerturbedLinear"]["(4, 8)"] == pytest.approx(8 * (4 * 8 + 4) * 4 / 2**20)
    # LowRankLinear rank 1: D x (out + in) + bias noise
    assert mib["LowRankLinear (rank=1)"]["(4, 8)"] == pytest.approx(8 * (4 + 8 + 4) * 4 / 2**20)
    conv = results["tables"]["conv"]["noise_mib"]
    assert conv["PerturbedConv2d"]["(4, 4, (3, 3), (6, 6))"] == pytest.approx(8 * (4 * 4 * 9 + 4) * 4 / 2**20)


def test_meta_and_json_round_trip(results):
    meta = results["meta"]
    for key in ("device", "device_name", "torch", "date", "threads", "population", "repeats", "warmup", "notes"):
        assert key in meta
    assert meta["threads"] == torch.get_num_threads()
    assert meta["population"] == 8 and meta["naive_rows"] == 4
    assert json.loads(json.dumps(results)) == results


def test_markdown_has_four_tables_per_family(results):
    text = bench.render_markdown(results)
    for title in ("Time (ms", "Speed multiplier vs. naive", "Time multiplier vs. base", "Noise memory (MiB"):
        assert text.count(title) == 2
    assert "| | (8, 8) | (4, 8) |" in text
    row = next(line for line in text.splitlines() if line.startswith("| PerturbedLinear |"))
    cells = results["tables"]["linear"]["ms"]["PerturbedLinear"]
    assert row == "| PerturbedLinear | " + " | ".join(f"{cells[s]:.3f}" for s in ("(8, 8)", "(4, 8)")) + " |"


def test_which_selects_the_family():
    only = bench.run("linear", **{**TINY, "linear_sizes": [(4, 4)]})
    assert list(only["tables"]) == ["linear"]


def test_naive_is_scaled_from_the_timed_rows(monkeypatch):
    timed = []

    def fake_time_call(fn, repeats, warmup, device):
        timed.append(fn)
        return 2.0

    monkeypatch.setattr(bench, "time_call", fake_time_call)
    ms, _ = bench.bench_size("linear", (4, 4), population=8, repeats=1, warmup=0, device="cpu", naive_rows=2)
    assert ms["Base"] == 2.0 and ms["Naive"] == 2.0 * 8 / 2


def test_cli_writes_json_and_markdown(tmp_path, capsys):
    json_path, md_path = tmp_path / "r.json", tmp_path / "r.md"
    rc = main(["--device", "cpu", "--population", "8", "--repeats", "2", "--warmup", "0",
               "--linear-sizes", "8x8", "--conv-sizes", "4x4x3x6", "--json", str(json_path),
               "--markdown", str(md_path)])
    assert rc == 0
    out = capsys.readouterr().out
    assert out == md_path.read_text()
    data = json.loads(json_path.read_text())
    assert data["tables"]["linear"]["sizes"] == ["(8, 8)"]
    assert data["tables"]["conv"]["sizes"] == ["(4, 4, (3, 3), (6, 6))"]
    assert data["meta"]["repeats"] == {"linear": 2, "conv": 2}


def test_cli_quick_defaults(monkeypatch, capsys):
    seen = {}

    def fake_run(which, device, population, linear_sizes, conv_sizes, linear_repeats, conv_repeats, warmup,
                 naive_rows, quick, log):
        seen.update(conv_sizes=conv_sizes, repeats=(linear_repeats, conv_repeats), warmup=warmup, quick=quick)
        return {"meta": {"device": "cpu", "device_name": "x", "torch": "x", "threads": 1, "population": 8,
                         "date": "x", "quick": quick, "notes": []}, "tables": {}}

    monkeypatch.setattr(bench, "run", fake_run)
    assert main(["--device", "cpu", "--quick"]) == 0
    assert seen == dict(conv_sizes=bench.QUICK_CONV_SIZES, repeats=(5, 2), warmup=1, quick=True)
    assert main(["--device", "cpu", "--quick", "--repeats", "7"]) == 0
    assert seen["repeats"] == (7, 7)


@pytest.mark.parametrize("argv", [
    ["--population", "0"],
    ["--which", "rnn"],
    ["--linear-sizes", "8x"],
    ["--conv-sizes", "4x4x3"],
    ["--device", "tpu"],
    ["--repeat", "2"],  # a prefix of --repeats: whole flag names only
    ["--linear-sizes", "-8x8"],
])
def test_cli_rejects_bad_input(argv):
    with pytest.raises(SystemExit) as err:
        main(argv)
    assert err.value.code == 2


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error without CUDA")
def test_cli_cuda_without_cuda_is_an_error():
    with pytest.raises(SystemExit) as err:
        main(["--device", "cuda"])
    assert err.value.code == 2
