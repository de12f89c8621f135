"""Experiment trackers: TensorBoard (hparams, config text), W&B offline runs, an MLflow file store, resume into
the same tracker run, the --log names, and a tracker that fails without stopping the run. No network."""

import json
import struct
import time
import warnings
from pathlib import Path

import pytest

from nesgpu.train.storage import loggers
from nesgpu.train.storage.loggers import MLflowLogger, TensorBoardLogger, WandbLogger, make_loggers
from nesgpu.train.storage.metrics import MetricsLog

CONFIG = {"task": "digits", "strategy": "openai_es", "lr": 0.1, "hidden": (8,), "layer_options": {"rank": 2},
          "target": None, "antithetic": True, "chunk_size": None, "note": "x" * 7000}
SUMMARY = {"task": "digits", "metric": "test_accuracy", "value": 0.75, "steps": 3, "seconds": 1.5, "env_steps": 30}


@pytest.fixture(autouse=True)
def offline(monkeypatch, tmp_path):
    """Trackers stay on this machine and out of the home directory."""
    for name in ("WANDB_PROJECT", "WANDB_NAME", "WANDB_DIR", "WANDB_API_KEY", "MLFLOW_TRACKING_URI",
                 "MLFLOW_EXPERIMENT_NAME", "MLFLOW_ALLOW_FILE_STORE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_CONSOLE", "off")
    monkeypatch.setenv("WANDB_DISABLE_GIT", "true")
    for name in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(name, str(tmp_path / "home" / name.lower()))
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
    monkeypatch.setenv("DO_NOT_TRACK", "true")


def rows(first: int, last: int) -> list[dict]:
    return [{"step": s, "seconds": 0.5 * s, "env_steps": 10 * s, "fitness_mean": float(s), "lr": 0.1,
             **({"test_accuracy": 0.5} if s == 3 else {})} for s in range(first, last + 1)]


def run(out: Path, logger_list, resume_step=0, steps=(1, 3), summary=SUMMARY, config=CONFIG, **close):
    log = MetricsLog(out, resume_step=resume_step, loggers=logger_list, config=config)
    for row in rows(*steps):
        log.write(row)
    log.close(summary, **close)
    return log


# ----- names ------------------------------------------------------------------------------------------------
def test_unknown_logger_name_is_an_error(tmp_path):
    with pytest.raises(ValueError, match=r"unknown logger 'comet'.*'tensorboard', 'wandb', 'mlflow'.*'none'"):
        make_loggers(["tensorboard", "comet"], tmp_path)
    with pytest.raises(ValueError, match="cannot be combined"):
        make_loggers(["none,tensorboard"], tmp_path)
    assert make_loggers(["none"], tmp_path) == []
    assert make_loggers([], tmp_path) == []


def test_names_split_on_commas_without_duplicates(tmp_path):
    pytest.importorskip("tensorboard")
    made = make_loggers(["TensorBoard, tensorboard"], tmp_path)
    assert [type(m) for m in made] == [TensorBoardLogger]
    assert all(isinstance(m, loggers.Logger) for m in made)


def test_missing_package_is_an_import_error_and_missing_tensorboard_a_warning(tmp_path, monkeypatch):
    monkeypatch.setattr(loggers.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ImportError, match=r"pip install 'nesgpu\[log\]'"):
        make_loggers(["wandb"], tmp_path)
    with pytest.raises(ImportError, match=r"pip install 'nesgpu\[train\]'"):
        make_loggers(["tensorboard"], tmp_path)
    with pytest.warns(UserWarning, match="tensorboard is not installed"):
        assert make_loggers(None, tmp_path) == []
    with pytest.warns(UserWarning, match="tensorboard is not installed"):
        log = MetricsLog(tmp_path)  # the trainer's call keeps working without tensorboard
    log.write(rows(1, 1)[0])
    log.close()
    assert len((tmp_path / "metrics.csv").read_text().splitlines()) == 2


# ----- a failing tracker ------------------------------------------------------------------------------------
class Recorder:
    name = "recorder"

    def __init__(self, fail_in=None):
        self.calls, self.fail_in = [], fail_in

    def start(self, config, resume_step):
        self.calls.append(("start", resume_step))
        if self.fail_in == "start":
            raise ConnectionError("tracker unreachable")

    def log(self, step, row):
        self.calls.append(("log", step))
        if self.fail_in == "log":
            raise ConnectionError("tracker unreachable")

    def finish(self, summary, status=None):
        self.calls.append(("finish", status if summary is None else summary["value"]))


@pytest.mark.parametrize("fail_in", ["start", "log"])
def test_a_failing_logger_warns_once_and_the_run_goes_on(tmp_path, fail_in):
    bad, good = Recorder(fail_in), Recorder()
    with pytest.warns(RuntimeWarning, match=f"logger 'recorder' failed in {fail_in}.*tracker unreachable") as w:
        run(tmp_path, [bad, good])
    assert len([x for x in w if issubclass(x.category, RuntimeWarning)]) == 1
    assert len((tmp_path / "metrics.csv").read_text().strip().splitlines()) == 1 + 3
    assert good.calls == [("start", 0), ("log", 1), ("log", 2), ("log", 3), ("finish", 0.75)]
    assert bad.calls[-1] == ("finish", "FAILED")  # ended once, right after failing; nothing more
    assert [c for c in bad.calls if c[0] == "log"] == ([("log", 1)] if fail_in == "log" else [])


def test_close_counts_once_and_passes_the_status(tmp_path):
    rec = Recorder()
    log = MetricsLog(tmp_path, loggers=[rec])
    log.close(status="KILLED")
    log.close(SUMMARY)
    assert rec.calls == [("start", 0), ("finish", "KILLED")]


# ----- TensorBoard ------------------------------------------------------------------------------------------
def events(path: Path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(path), size_guidance={"tensors": 0, "scalars": 0})
    acc.Reload()
    return acc


def test_tensorboard_writes_scalars_config_text_and_hparams(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.plugins.hparams import metadata

    run(tmp_path, [TensorBoardLogger(tmp_path)])
    assert [p.name for p in (tmp_path / "tensorboard").iterdir() if p.is_dir()] == []  # no sub-run
    acc = events(tmp_path / "tensorboard")
    assert {"fitness_mean", "test_accuracy", "final/test_accuracy", "final/steps"} <= set(acc.Tags()["scalars"])
    assert [e.step for e in acc.Scalars("fitness_mean")] == [1, 2, 3]
    assert acc.Scalars("final/test_accuracy")[0].value == pytest.approx(0.75)
    text = acc.Tensors("config/text_summary")[0].tensor_proto.string_val[0].decode()
    assert text.startswith("```") and "lr: 0.1" in text and "rank: 2" in text
    content = acc.PluginTagToContent(metadata.PLUGIN_NAME)
    assert metadata.EXPERIMENT_TAG not in content  # TensorBoard joins the runs' own options and scalars
    start = metadata.parse_session_start_info_plugin_data(content[metadata.SESSION_START_INFO_TAG])
    assert start.hparams["lr"].number_value == pytest.approx(0.1)
    assert start.hparams["hidden"].string_value == "[8]"
    assert start.hparams["layer_options.rank"].number_value == 2
    assert start.hparams["antithetic"].string_value == "True"
    assert "target" not in start.hparams  # None: no value


def test_metrics_log_mirrors_to_tensorboard_by_default_and_purges_on_resume(tmp_path):
    pytest.importorskip("tensorboard")
    log = MetricsLog(tmp_path)  # the trainer's call as it is today
    for row in rows(1, 3):
        log.write(row)
    log.close()
    # TensorBoard reads event files in name order: the name holds the second and a per-process counter, so
    # two writers in one second could sort 10 before 9. A resumed run starts at least a second later.
    first = int(next((tmp_path / "tensorboard").glob("events.out.tfevents.*")).name.split(".")[3])
    while int(time.time()) <= first:
        time.sleep(0.05)
    log = MetricsLog(tmp_path, resume_step=2)
    for row in rows(3, 4):
        log.write(dict(row, fitness_mean=10.0 * row["step"]))
    log.close()
    acc = events(tmp_path / "tensorboard")
    assert [(e.step, e.value) for e in acc.Scalars("fitness_mean")] == [(1, 1.0), (2, 2.0), (3, 30.0), (4, 40.0)]
    assert "final/test_accuracy" not in acc.Tags()["scalars"]  # no summary: no hparams


# ----- Weights & Biases -------------------------------------------------------------------------------------
def wandb_records(path: Path) -> list:
    """The records of an offline run's transaction log (LevelDB log format: 32 KiB blocks of chunks with a
    7-byte header: crc32, length, type 1 full / 2 first / 3 middle / 4 last)."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    records, pending, pos, block = [], b"", 7, 32768
    while pos + 7 <= len(data):
        if block - pos % block < 7:
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        pending += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    return records


def wandb_run(run_dir: Path, timeout: float = 120.0) -> dict:
    """What an offline run holds: its id, project, config, history by step, summary and exit code. W&B's
    finish() returns before its service has written the log out (the process exit waits for it): poll."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            found = read_wandb_run(next(run_dir.glob("run-*.wandb")))
        except Exception:  # a record half written
            found = {}
        if "exit_code" in found or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


def read_wandb_run(path: Path) -> dict:
    found = {"history": {}, "summary": {}}
    for record in wandb_records(path):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            found.update(id=record.run.run_id, project=record.run.project, name=record.run.display_name,
                         config={i.key: json.loads(i.value_json) for i in record.run.config.update})
        elif kind == "history":
            values = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item}
            found["history"][values.pop("_step")] = values
        elif kind == "summary":
            found["summary"].update({i.key or "/".join(i.nested_key): json.loads(i.value_json)
                                     for i in record.summary.update})
        elif kind == "exit":
            found["exit_code"] = record.exit.exit_code
    return found


def test_wandb_offline_run_under_out_and_resume_continues_it(tmp_path):
    pytest.importorskip("wandb")
    out = tmp_path / "digits-run"
    out.mkdir()
    run(out, [WandbLogger(out)])
    run_id = json.loads((out / "trackers.json").read_text())["wandb"]
    (first,) = (out / "wandb").glob(f"offline-run-*-{run_id}")
    found = wandb_run(first)
    assert (found["id"], found["project"], found["name"]) == (run_id, "nesgpu", "digits-run")
    assert found["config"]["lr"] == 0.1 and found["config"]["hidden"] == [8]
    assert {s: h["fitness_mean"] for s, h in found["history"].items()} == {1: 1.0, 2: 2.0, 3: 3.0}
    assert found["history"][3]["test_accuracy"] == 0.5 and "test_accuracy" not in found["history"][1]
    assert found["summary"]["final/test_accuracy"] == 0.75
    assert found["exit_code"] == 0

    # resumed at step 2: the same W&B run id, in a second offline directory
    run(out, [WandbLogger(out)], resume_step=2, steps=(3, 4), summary=None, config=dict(CONFIG, lr=0.2))
    resumed = [d for d in (out / "wandb").glob(f"offline-run-*-{run_id}*") if d != first]
    assert len(resumed) == 1
    found = wandb_run(resumed[0])
    assert found["id"] == run_id and found["config"]["lr"] == 0.2
    assert sorted(found["history"]) == [3, 4]
    assert found["exit_code"] == 1  # closed without a summary: failed

    # a new run in the same directory (--overwrite) gets a new id
    run(out, [WandbLogger(out)])
    assert json.loads((out / "trackers.json").read_text())["wandb"] != run_id


# ----- MLflow -----------------------------------------------------------------------------------------------
def test_mlflow_file_store_params_metrics_and_resume(tmp_path):
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient
    from mlflow.utils.validation import MAX_PARAM_VAL_LENGTH

    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # no tracker failure
        run(tmp_path, [MLflowLogger(tmp_path)])
    ids = json.loads((tmp_path / "trackers.json").read_text())["mlflow"]
    assert ids["tracking_uri"] == (tmp_path / "mlruns").resolve().as_uri()
    client = MlflowClient(ids["tracking_uri"])
    first = client.get_run(ids["run_id"])
    assert first.info.status == "FINISHED" and first.info.run_name == tmp_path.name
    assert client.get_experiment(first.info.experiment_id).name == "nesgpu"
    params = first.data.params
    assert params["lr"] == "0.1" and params["hidden"] == "[8]" and params["layer_options.rank"] == "2"
    assert params["strategy"] == "openai_es" and params["target"] == "None"
    assert len(params["note"]) == MAX_PARAM_VAL_LENGTH
    history = client.get_metric_history(ids["run_id"], "fitness_mean")
    assert [(m.step, m.value) for m in history] == [(1, 1.0), (2, 2.0), (3, 3.0)]
    assert [(m.step, m.value) for m in client.get_metric_history(ids["run_id"], "test_accuracy")] == [(3, 0.5)]
    assert first.data.metrics["final/test_accuracy"] == 0.75

    # resumed (with a new lr): the same run, reopened; the changed option logged from the step it applies
    log = MetricsLog(tmp_path, resume_step=3, loggers=[MLflowLogger(tmp_path)], config=dict(CONFIG, lr=0.2))
    assert client.get_run(ids["run_id"]).info.status == "RUNNING"
    for row in rows(4, 5):
        log.write(row)
    log.close(status="KILLED")
    assert json.loads((tmp_path / "trackers.json").read_text())["mlflow"] == ids
    resumed = client.get_run(ids["run_id"])
    assert resumed.info.status == "KILLED"
    assert resumed.data.params["lr"] == "0.1" and resumed.data.params["lr.from_step_4"] == "0.2"
    history = client.get_metric_history(ids["run_id"], "fitness_mean")
    assert [m.step for m in history] == [1, 2, 3, 4, 5]
    assert len(client.search_runs([first.info.experiment_id])) == 1


def test_mlflow_tracking_uri_from_the_environment(tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    store = (tmp_path / "shared-store").as_uri()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # a file store the user chose
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "sweep")
    out = tmp_path / "run"
    out.mkdir()
    run(out, [MLflowLogger(out)], summary=None)
    assert not (out / "mlruns").exists()
    ids = json.loads((out / "trackers.json").read_text())["mlflow"]
    assert ids["tracking_uri"] == store
    found = MlflowClient(store).get_run(ids["run_id"])
    assert found.info.status == "FAILED"  # closed without a summary
    assert MlflowClient(store).get_experiment(found.info.experiment_id).name == "sweep"


def test_resume_rewrites_the_kept_rows_digit_for_digit(tmp_path):
    """A resumed run rewrites metrics.csv up to its checkpoint: integers past 1e6 (env steps) must not come
    back rounded to 6 significant digits."""
    log = MetricsLog(tmp_path, loggers=[])
    rows = [{"step": 1, "seconds": 1.25, "env_steps": 23983891, "fitness_mean": -0.5},
            {"step": 2, "seconds": 2.5, "env_steps": 24055913, "fitness_mean": 0.25},
            {"step": 3, "seconds": 3.75, "env_steps": 24123516, "fitness_mean": 1.0}]
    for row in rows:
        log.write(row)
    before = (tmp_path / "metrics.csv").read_text().splitlines()
    MetricsLog(tmp_path, resume_step=2, loggers=[])
    after = (tmp_path / "metrics.csv").read_text().splitlines()
    assert after == before[:3] and "24055913" in after[2]


@pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")  # the writer thread's traceback
@pytest.mark.parametrize("fail_after", [0, 3])
def test_a_tensorboard_disk_failure_is_one_warning_and_the_run_goes_on(tmp_path, monkeypatch, capsys, fail_after):
    import errno

    pytest.importorskip("tensorboard")
    from tensorboard.summary.writer import record_writer

    from nesgpu.cli import main

    original, writes = record_writer.RecordWriter.write, []

    def write(self, data):  # the disk fills up after ``fail_after`` records
        writes.append(1)
        if len(writes) > fail_after:
            raise OSError(errno.ENOSPC, "No space left on device")
        original(self, data)
    monkeypatch.setattr(record_writer.RecordWriter, "write", write)
    assert main(["train", "--steps", "4", "--population", "8", "--hidden", "4", "--out", str(tmp_path / "r")]) == 0
    err = capsys.readouterr().err
    assert "Traceback" not in err and "Exception in thread" not in err
    assert "logger 'tensorboard' failed in" in err and "No space left on device" in err
    assert (tmp_path / "r" / "summary.json").is_file()
