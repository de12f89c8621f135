"""A run directory from a stranger is data: each file nesgpu reads back (config.json, metrics.csv, state.pt, the
weights, samples.jsonl, the lock, a drift text) that is damaged, hostile or gone is one ValueError that names the
file and what was expected; never a traceback, a hang, a whole-device read or advice to load code."""

import json
import os
import shutil
import socket
import subprocess
import sys
import warnings

import pytest
import torch

from nesgpu.train import TrainConfig, train
from nesgpu.train.storage.metrics import MetricsLog
from nesgpu.train.storage.rundir import RunLock
from nesgpu.train.storage.runs import load_run, read_config
from nesgpu.train.storage.samples import keep_samples_to

RUN = dict(task="cartpole", population=8, steps=2, hidden=(4,), log="none")


def quiet(*args, **kwargs):
    pass


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    out = tmp_path_factory.mktemp("runs") / "run"
    train(TrainConfig.flat(**RUN, out=str(out)), log=quiet)
    return out


@pytest.fixture
def run(finished, tmp_path):
    """A copy of a finished run, to damage."""
    return shutil.copytree(finished, tmp_path / "copy")


def config(run) -> dict:
    return json.loads((run / "config.json").read_text())


def damage_config(run, how):
    path = run / "config.json"
    if how == "deep":
        path.write_text("[" * 100_000 + "]" * 100_000)
    elif how == "not utf-8":
        path.write_bytes(path.read_bytes().replace(b"cartpole", b"cart\xffpole"))
    elif how == "list":
        path.write_text("[1, 2]")
    elif how == "/dev/zero":
        path.unlink()
        path.symlink_to("/dev/zero")
    elif how == "fifo":
        path.unlink()
        os.mkfifo(path)
    elif how == "another strategy's option":
        path.write_text(json.dumps({**config(run), "elite_ratio": 0.3}))


@pytest.mark.parametrize("how, expected", [
    ("deep", "nests more than 64 levels deep"), ("not utf-8", "is not UTF-8 text"),
    ("list", "holds a list; expected a run's mapping of options"), ("/dev/zero", "is not a regular file"),
    ("fifo", "is not a regular file .*FIFO"), ("another strategy's option", "option 'elite_ratio' .* drop it")])
def test_a_damaged_config_json_is_named(run, how, expected):
    damage_config(run, how)
    with pytest.raises(ValueError, match=f"^{run / 'config.json'}.*{expected}"):
        load_run(run, device="cpu")


def test_a_config_json_nested_deep_is_one_line_from_the_cli(run):
    damage_config(run, "deep")
    done = subprocess.run([sys.executable, "-m", "nesgpu", "eval", str(run)], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert "config.json nests more than 64 levels deep" in done.stderr


def test_a_source_model_that_is_gone_is_named_with_the_run(tmp_path):
    run = tmp_path / "lm"
    run.mkdir()
    cfg = TrainConfig(task="arithmetic", model=f"hf:{tmp_path / 'gone'}", out=str(run))
    (run / "config.json").write_text(cfg.to_json())
    with pytest.raises(ValueError, match=rf"config.json names --model hf:{tmp_path / 'gone'}, the model the run "
                                         rf"started from, .* restore that model directory"):
        load_run(run, device="cpu")
    (run / "config.json").write_text(json.dumps({**json.loads(cfg.to_json()), "drift_text": "gone.txt"}))
    with pytest.raises(ValueError, match=r"config.json names the drift text gone.txt \(--drift-text\), which is "
                                         r"gone: .*set \"drift_text\" to null"):
        load_run(run, device="cpu")


def test_a_drift_text_that_is_not_utf8_is_named(tmp_path):
    from nesgpu.tasks.divergence import read_texts

    (tmp_path / "drift.txt").write_bytes(b"fine\n\xff\n")
    with pytest.raises(ValueError, match=r"drift text .*drift.txt: not UTF-8 text \(byte 5\)"):
        read_texts(tmp_path / "drift.txt")


# ----- metrics.csv -----------------------------------------------------------------------------------------
def damage_metrics(path, how):
    good = path.read_bytes()
    lines = good.splitlines(keepends=True)
    if how == "huge field":  # past csv's field limit (128 KiB)
        path.write_bytes(lines[0] + b"1," + b"7" * 200_000 + b"\n" + b"".join(lines[1:]))
    elif how == "not utf-8":
        path.write_bytes(good.replace(b"\n1,", b"\n1\xff,"))
    elif how == "header twice":
        path.write_bytes(lines[0].replace(b"seconds", b"step") + b"".join(lines[1:]))
    elif how == "garbage":
        path.write_bytes(b"hello,world\n1,2\n")
    elif how in ("a word", "NUL"):  # row 0's seconds (the second column)
        fields = lines[1].split(b",", 2)
        fields[1] = b"zero" if how == "a word" else b"0\x00"
        path.write_bytes(lines[0] + b",".join(fields) + b"".join(lines[2:]))
    elif how == "fifo":
        path.unlink()
        os.mkfifo(path)


@pytest.mark.parametrize("how, expected", [
    ("huge field", ", line 2: field larger than field limit"), ("not utf-8", " is not UTF-8 text"),
    ("header twice", ": its header names column 'step' twice"), ("garbage", ": its header has no 'step' column"),
    ("a word", ", line 2: seconds is 'zero'; expected a number"), ("NUL", ", line 2: seconds is '0\\\\x00'"),
    ("fifo", " is not a regular file")])
def test_a_damaged_metrics_csv_is_named(run, how, expected):
    damage_metrics(run / "metrics.csv", how)
    with pytest.raises(ValueError, match=f"^{run / 'metrics.csv'}{expected}"):
        MetricsLog.read(run / "metrics.csv")


def test_a_damaged_metrics_csv_stops_a_resume_with_one_line(run):
    damage_metrics(run / "metrics.csv", "huge field")
    before = (run / "config.json").read_bytes()
    done = subprocess.run([sys.executable, "-m", "nesgpu", "train", "--resume", str(run), "--steps", "3"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert "metrics.csv, line 2: field larger than field limit" in done.stderr
    assert (run / "config.json").read_bytes() == before  # the refused resume left its steps (2, not 3) as they were


def test_a_resume_says_which_rows_it_drops_and_keeps_the_rest(tmp_path):
    log = MetricsLog(tmp_path, loggers=[])
    for step in range(6):
        log.write({"step": step, "seconds": float(step)})
    log.close()
    with pytest.warns(UserWarning, match=r"the rows of steps 4-5, after the checkpoint's step 3, are dropped"):
        log = MetricsLog(tmp_path, resume_step=3, loggers=[])
    assert [row["step"] for row in log.rows] == [0, 1, 2, 3]
    assert [row["step"] for row in MetricsLog.read(tmp_path / "metrics.csv")] == [0, 1, 2, 3]
    log.write({"step": 4, "seconds": 4.0})
    log.close()
    with pytest.warns(UserWarning, match=r"the row of step 4, after the checkpoint's step 3, is dropped"):
        MetricsLog(tmp_path, resume_step=3, loggers=[])


def test_a_last_metrics_line_cut_short_is_dropped_with_a_warning(tmp_path):
    (tmp_path / "metrics.csv").write_text("step,seconds\n0,0\n1,0.5\n2,1e")
    with pytest.warns(UserWarning, match="its last line was cut short"):
        rows = MetricsLog.read(tmp_path / "metrics.csv")
    assert rows == [{"step": 0, "seconds": 0}, {"step": 1, "seconds": 0.5}]


# ----- checkpoints and weights -----------------------------------------------------------------------------
class Payload:
    """What a hostile state.pt would run when unpickled."""

    def __reduce__(self):
        return (os.system, ("touch ran",))


@pytest.mark.parametrize("state, expected", [
    ({"x": Payload()}, r"is not a checkpoint nesgpu wrote: it holds objects other than tensors"),
    ([1, 2], r"holds a list; expected the mapping of state nesgpu train writes"),
    ({"strategy": [1]}, r"records step None; expected a whole number >= 0")])
def test_a_state_pt_that_nesgpu_did_not_write_is_named_never_run(run, tmp_path, monkeypatch, state, expected):
    monkeypatch.chdir(tmp_path)
    (run / "model.safetensors").unlink()  # an unfinished run: evaluated from its checkpoint
    torch.save(state, run / "checkpoint" / "state.pt")
    with pytest.raises(ValueError, match=f"{run / 'checkpoint'}.*{expected}") as refused:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            load_run(run, device="cpu")
    assert "weights_only" not in str(refused.value) and not (tmp_path / "ran").exists()


def test_a_checkpoint_with_a_damaged_record_is_named_on_resume(run):
    state = torch.load(run / "checkpoint" / "state.pt", weights_only=True)
    torch.save({**state, "seconds": None}, run / "checkpoint" / "state.pt")
    with pytest.raises(ValueError, match=r"checkpoint in .*its seconds is None; expected a number >= 0"):
        train(TrainConfig.flat(**{**RUN, "steps": 3}, out=str(run)), resume=True, log=quiet)


def test_weights_with_a_name_the_model_lacks_are_one_line(run):
    from safetensors import safe_open
    from safetensors.torch import save_file

    with safe_open(str(run / "model.safetensors"), "pt") as f:
        metadata, tensors = f.metadata(), {name: f.get_tensor(name) for name in f.keys()}
    save_file({**tensors, "extra": torch.zeros(2)}, str(run / "model.safetensors"), metadata=metadata)
    with pytest.raises(ValueError, match=r"do not match the model: .*Unexpected key\(s\)") as refused:
        load_run(run, device="cpu")
    assert "\n" not in str(refused.value)


def test_a_run_that_stopped_before_its_first_checkpoint_says_to_start_again(run):
    shutil.rmtree(run / "checkpoint")
    (run / "model.safetensors").unlink()
    again = f"nesgpu train --config {run / 'config.json'} --out {run} --overwrite"
    with pytest.raises(ValueError, match=f"holds no weights yet .*; train it again: {again}"):
        load_run(run, device="cpu")
    with pytest.raises(ValueError, match=f"cannot resume {run}: it holds no checkpoint .*start it again: {again}"):
        train(TrainConfig.flat(**{**RUN, "steps": 3}, out=str(run)), resume=True, log=quiet)


# ----- the lock, --out, samples.jsonl ----------------------------------------------------------------------
def test_a_lock_from_another_host_says_how_to_remove_it(tmp_path):
    (tmp_path / ".lock").write_text("elsewhere:4242")
    with pytest.raises(ValueError, match=rf"locked by process 4242 on host elsewhere \({tmp_path / '.lock'}\), "
                                         rf"which this host \({socket.gethostname()}\) cannot check: .* remove "
                                         rf"{tmp_path / '.lock'}"):
        with RunLock(tmp_path):
            pass


def test_a_lock_that_is_a_fifo_is_not_waited_on(tmp_path):
    os.mkfifo(tmp_path / ".lock")  # no owner in it: a stale lock, taken over
    with RunLock(tmp_path) as lock:
        assert lock.held and (tmp_path / ".lock").read_text().endswith(f":{os.getpid()}")


def test_an_out_that_is_a_symlink_loop_is_named_as_one(tmp_path):
    (tmp_path / "run").symlink_to(tmp_path / "run")
    with pytest.raises(ValueError, match=r"--out .*run is a symbolic link \(.* -> .*\) that leads back to itself"):
        train(TrainConfig.flat(**RUN, out=str(tmp_path / "run")), log=quiet)
    with pytest.raises(ValueError, match=r"is not a run directory \(a symbolic link to .*, which does not exist or "
                                         r"loops\)"):
        read_config(tmp_path / "run")


@pytest.mark.parametrize("content, expected", [
    ("[" * 100_000 + "]" * 100_000 + '\n{"step": 1}\n', r"line 1, is not a sample \(nested too deep\)"),
    ('{"step": "1"}\n{"step": 1}\n', r"line 1, is not a sample \(expected a JSON object with a whole-number"),
    (b'{"step": 1, "completion": "\xff"}\n', "is not UTF-8 text")])
def test_a_damaged_samples_file_is_named(tmp_path, content, expected):
    path = tmp_path / "samples.jsonl"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(ValueError, match=f"^{path}.*{expected}"):
        keep_samples_to(path, 1, quiet)


def test_a_samples_file_is_kept_to_the_checkpoint_and_a_fifo_is_refused(tmp_path):
    path = tmp_path / "samples.jsonl"
    path.write_text('{"step": 1, "completion": "a"}\n{"step": 2, "completion": "b"}\n{"step": 3, "comp')
    notes = []
    keep_samples_to(path, 1, notes.append)
    assert path.read_text() == '{"step": 1, "completion": "a"}\n' and "cut short" in notes[0]
    path.unlink()
    os.mkfifo(path)
    with pytest.raises(ValueError, match="is not a regular file"):
        keep_samples_to(path, 1, quiet)


def test_a_run_started_without_kl_resumed_with_it_says_so(tmp_path):
    tf = pytest.importorskip("transformers")
    from conftest import CHARS, char_tokenizer

    from nesgpu.tasks.reward_data import dataset_task

    def lm_run(steps, kl, resume=False):
        torch.manual_seed(0)
        model = tf.LlamaForCausalLM(tf.LlamaConfig(
            vocab_size=len(CHARS) + 3, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0,
            bos_token_id=1, eos_token_id=1)).eval()
        task = dataset_task([{"prompt": f"{a}+{b}="} for a in range(3) for b in range(3)], char_tokenizer(),
                            lambda completions, **kw: [float(c.count("1")) for c in completions], max_new_tokens=3,
                            prompts_per_step=2, kl=kl)
        cfg = TrainConfig(task="generation", population=4, sigma=0.2, lr=0.05, steps=steps, out=str(tmp_path / "lm"),
                          log="none")
        train(cfg, model=model, task=task, resume=resume, log=quiet)

    lm_run(1, kl=False)
    with pytest.warns(UserWarning, match=r"holds no starting weights \(the run started without kl and without a "
                                         r"drift text"):
        lm_run(2, kl=True, resume=True)
