"""Experiment trackers a run mirrors its metrics to: TensorBoard, Weights & Biases, MLflow.

Every tracker is a :class:`Logger`: ``start(config, resume_step)`` once, ``log(step, row)`` per step (the
row of metrics.csv), ``finish(summary)`` at the end (``summary=None``: the run did not finish). They keep
their files in the run directory: ``tensorboard/``, ``wandb/`` (offline runs unless ``WANDB_MODE`` says
otherwise) and ``mlruns/`` (an MLflow file store unless ``MLFLOW_TRACKING_URI`` names another). A resumed
run continues the same W&B and MLflow run: their ids are kept in ``trackers.json``.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import secrets
import string
import threading
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol, runtime_checkable

from .checkpoint import write_json

LOGGERS = ("tensorboard", "wandb", "mlflow")
NONE = "none"
IDS_FILE = "trackers.json"  # the W&B / MLflow run ids a resumed run continues
PROJECT = "nesgpu"  # W&B project and MLflow experiment unless WANDB_PROJECT / MLFLOW_EXPERIMENT_NAME say otherwise
# the package each tracker needs, and the extra that brings it
PACKAGES = {"tensorboard": ("tensorboard", "train"), "wandb": ("wandb", "log"), "mlflow": ("mlflow", "log")}


@runtime_checkable
class Logger(Protocol):
    """An experiment tracker. ``finish(None)`` ends a run that failed; ``status`` ("FINISHED", "FAILED",
    "KILLED") says more where the caller knows it (default: FINISHED with a summary, FAILED without)."""

    name: str

    def start(self, config: dict, resume_step: int) -> None: ...

    def log(self, step: int, row: dict) -> None: ...

    def finish(self, summary: dict | None, status: str | None = None) -> None: ...


def make_loggers(names: Sequence[str] | None, out: Path) -> list[Logger]:
    """The trackers named by ``--log``: any of "tensorboard", "wandb", "mlflow" (comma-separated or as a list),
    or "none". ``None`` (no ``--log``): TensorBoard when installed, else none with a warning.

    An unknown name raises ValueError; a tracker whose package is missing raises ImportError."""
    out = Path(out)
    if names is None:
        if importlib.util.find_spec("tensorboard") is None:
            warnings.warn("tensorboard is not installed: no TensorBoard events (pip install 'nesgpu[train]')",
                          stacklevel=2)
            return []
        return [TensorBoardLogger(out)]
    if isinstance(names, str):
        names = [names]
    wanted: list[str] = []
    for item in names:
        for name in str(item).split(","):
            name = name.strip().lower()
            if not name:
                continue
            if name != NONE and name not in LOGGERS:
                raise ValueError(f"unknown logger {name!r}; expected any of {list(LOGGERS)} or {NONE!r}")
            if name not in wanted:
                wanted.append(name)
    if NONE in wanted:
        if len(wanted) > 1:
            raise ValueError(f"--log {NONE!r} cannot be combined with other loggers; got {wanted}")
        return []
    for name in wanted:
        package, extra = PACKAGES[name]
        if importlib.util.find_spec(package) is None:
            raise ImportError(f"--log {name} needs the {package} package: pip install 'nesgpu[{extra}]'")
    kinds = {"tensorboard": TensorBoardLogger, "wandb": WandbLogger, "mlflow": MLflowLogger}
    return [kinds[name](out) for name in wanted]


# ----- helpers ----------------------------------------------------------------------------------------------
def flatten(config: dict, prefix: str = "") -> dict:
    """Nested mappings as dotted keys (``layer_options.rank``); lists and tuples as JSON strings."""
    flat = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            flat.update(flatten(value, name + "."))
        elif isinstance(value, (list, tuple, dict)):
            flat[name] = json.dumps(list(value) if not isinstance(value, dict) else value, default=str)
        else:
            flat[name] = value
    return flat


def scalars(row: dict) -> dict[str, float]:
    """The numeric entries of a metrics row, without "step" (the x axis) and empty values."""
    values = {}
    for key, value in row.items():
        if key == "step" or value is None or isinstance(value, bool):
            continue
        try:
            values[key] = float(value)
        except (TypeError, ValueError):
            continue
    return values


def final_metrics(summary: dict) -> dict[str, float]:
    """What a finished run ends with, as ``final/...`` values: the task's metric, steps, seconds, env steps."""
    final = {}
    metric = summary.get("metric") or "value"
    for key, name in (("value", metric), ("steps", "steps"), ("seconds", "seconds"), ("env_steps", "env_steps")):
        value = summary.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            final[f"final/{name}"] = float(value)
    return final


def _read_ids(out: Path) -> dict:
    try:
        ids = json.loads((out / IDS_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return ids if isinstance(ids, dict) else {}


def _write_id(out: Path, key: str, value) -> None:
    ids = _read_ids(out)
    ids[key] = value
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / IDS_FILE, ids)


def _config_text(config: dict) -> str:
    """The config as a markdown code block (YAML when PyYAML is there, else JSON)."""
    plain = json.loads(json.dumps(config, default=str))
    try:
        import yaml

        return "```yaml\n" + yaml.safe_dump(plain, sort_keys=False) + "```"
    except ImportError:
        return "```json\n" + json.dumps(plain, indent=2) + "\n```"


# ----- TensorBoard ------------------------------------------------------------------------------------------
def _quiet_tensorboard_threads() -> None:
    """TensorBoard's writer thread prints a traceback when its disk write fails (full disk, read-only
    directory) before the writer raises the same error in the run's thread, where MetricsLog turns it into one
    warning. Silence that thread's copy (only its OSErrors; every other thread's exceptions are as before)."""
    previous = threading.excepthook
    if getattr(previous, "nesgpu_quiet_tensorboard", False):
        return

    def hook(args):
        if issubclass(args.exc_type, OSError) and type(args.thread).__module__.startswith("tensorboard."):
            return
        previous(args)
    hook.nesgpu_quiet_tensorboard = True
    threading.excepthook = hook


class TensorBoardLogger:
    """Scalars per step in ``out/tensorboard``; the config as text; at the end the hyperparameters (for
    TensorBoard's HParams dashboard) with the final metric. A resumed run drops the events after its
    checkpoint (``purge_step``)."""

    name = "tensorboard"

    def __init__(self, out: Path, directory: str = "tensorboard"):
        self.path = Path(out) / directory
        self.writer = None
        self.config: dict = {}

    def start(self, config: dict, resume_step: int) -> None:
        from torch.utils.tensorboard import SummaryWriter

        _quiet_tensorboard_threads()
        self.writer = SummaryWriter(str(self.path), purge_step=resume_step + 1)
        self.config = dict(config)
        if config:
            self.writer.add_text("config", _config_text(config), resume_step)

    def log(self, step: int, row: dict) -> None:
        for key, value in scalars(row).items():
            self.writer.add_scalar(key, value, step)

    def finish(self, summary: dict | None, status: str | None = None) -> None:
        if self.writer is None:
            return
        try:
            if summary is not None:
                self._hparams(summary)
        finally:
            self.writer.close()
            self.writer = None

    def _hparams(self, summary: dict) -> None:
        """The run as one session of TensorBoard's HParams dashboard: its hyperparameters (the config's
        numbers and strings; bools, lists and mappings as text) and, as metrics, the last value of each scalar
        (``final/<metric>`` among them).

        Unlike SummaryWriter.add_hparams this writes into the run's own events (add_hparams opens a second
        writer in a sub-run, ``<logdir>/<time>`` unless given ``run_name``) and leaves out the experiment
        summary: TensorBoard takes one run's experiment summary for all runs under its --logdir (hiding the
        other runs' options and metrics); without one it joins every run's options and scalars."""
        from torch.utils.tensorboard.summary import hparams

        hparam_dict = {k: v if isinstance(v, (int, float, str)) and not isinstance(v, bool) else str(v)
                       for k, v in flatten(self.config).items() if v is not None}
        metrics = final_metrics(summary)
        step = int(summary.get("steps") or 0)
        _, start, end = hparams(hparam_dict, metrics)
        self.writer.file_writer.add_summary(start, step)
        self.writer.file_writer.add_summary(end, step)
        for key, value in metrics.items():
            self.writer.add_scalar(key, value, step)
        self.writer.flush()


# ----- Weights & Biases -------------------------------------------------------------------------------------
class WandbLogger:
    """A W&B run in ``out/wandb``: offline unless ``WANDB_MODE`` is set (``WANDB_MODE=online`` to sync live;
    ``wandb sync out/wandb/offline-run-*`` uploads later). Project: ``WANDB_PROJECT``, else "nesgpu". A
    resumed run continues the W&B run whose id ``trackers.json`` holds."""

    name = "wandb"

    def __init__(self, out: Path, project: str | None = None):
        self.out = Path(out)
        self.project = project
        self.run = None
        self.first_step = 0

    def start(self, config: dict, resume_step: int) -> None:
        import wandb

        stored = _read_ids(self.out).get("wandb")
        run_id = stored if resume_step and isinstance(stored, str) and stored else None
        if run_id is None:  # a new run (also one that --overwrite replaced) gets a new W&B run
            run_id = "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(8))
            _write_id(self.out, "wandb", run_id)
        self.out.mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(project=self.project or os.environ.get("WANDB_PROJECT") or PROJECT,
                              dir=str(self.out), name=os.environ.get("WANDB_NAME") or self.out.resolve().name,
                              config=config,
                              mode=os.environ.get("WANDB_MODE") or "offline", id=run_id, resume="allow",
                              allow_val_change=True,  # a resumed run may change lr, steps, ...
                              reinit="create_new")  # never the caller's own active run
        # an online run resumed after a crash holds the steps logged after the checkpoint already, and W&B
        # refuses steps below its last one: those rows are left out (offline runs start at 0)
        self.first_step = int(getattr(self.run, "starting_step", 0) or 0)

    def log(self, step: int, row: dict) -> None:
        if step >= self.first_step:
            self.run.log(scalars(row), step=step)

    def finish(self, summary: dict | None, status: str | None = None) -> None:
        if self.run is None:
            return
        run, self.run = self.run, None
        status = status or ("FINISHED" if summary is not None else "FAILED")
        if summary is not None:
            run.summary.update(final_metrics(summary))
        run.finish(exit_code=0 if status == "FINISHED" else 1)


# ----- MLflow -----------------------------------------------------------------------------------------------
class MLflowLogger:
    """An MLflow run: in a file store ``out/mlruns`` unless ``MLFLOW_TRACKING_URI`` is set (MLflow 3 refuses
    file stores without ``MLFLOW_ALLOW_FILE_STORE=true``; this logger sets that for its own default store).
    Experiment: ``MLFLOW_EXPERIMENT_NAME``, else "nesgpu". Parameters: the config, flattened; metrics:
    each step's row. A resumed run continues (and reopens) the MLflow run whose id ``trackers.json`` holds."""

    name = "mlflow"

    def __init__(self, out: Path, tracking_uri: str | None = None, experiment: str | None = None):
        self.out = Path(out)
        self.tracking_uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or None
        self.experiment = experiment
        self.client = None
        self.run_id: str | None = None

    def start(self, config: dict, resume_step: int) -> None:
        uri = self.tracking_uri
        if uri is None:
            uri = (self.out / "mlruns").resolve().as_uri()
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3: file stores are opt-in
        from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking_uri=uri)
        stored = _read_ids(self.out).get("mlflow")
        run = None
        if resume_step and isinstance(stored, dict) and stored.get("tracking_uri") == uri and stored.get("run_id"):
            try:
                run = client.get_run(stored["run_id"])
            except Exception as e:  # deleted, or another store: a new run
                warnings.warn(f"mlflow: cannot continue run {stored['run_id']} ({e}); starting a new one",
                              stacklevel=2)
        if run is None:
            name = self.experiment or os.environ.get("MLFLOW_EXPERIMENT_NAME") or PROJECT
            experiment = client.get_experiment_by_name(name)
            experiment_id = experiment.experiment_id if experiment else client.create_experiment(name)
            run = client.create_run(experiment_id, run_name=self.out.resolve().name,
                                    tags={"mlflow.source.name": "nesgpu"})
            _write_id(self.out, "mlflow", {"run_id": run.info.run_id, "tracking_uri": uri})
        else:
            client.update_run(run.info.run_id, status="RUNNING")
        self.client, self.run_id = client, run.info.run_id
        self._log_params(config, run.data.params, resume_step)

    def _log_params(self, config: dict, existing: dict, resume_step: int) -> None:
        """Params are write-once in MLflow: a value a resumed run changes goes in as ``<name>.from_step_<n>``."""
        from mlflow.entities import Param

        limit, key_limit, batch = _mlflow_limits()
        params = []
        for key, value in flatten(config).items():
            value = str(value)[:limit]
            key = key[:key_limit]
            if key in existing:
                if existing[key] == value:
                    continue
                key = f"{key}.from_step_{resume_step + 1}"[-key_limit:]
                if existing.get(key) == value:
                    continue
            params.append(Param(key, value))
        for i in range(0, len(params), batch):
            self.client.log_batch(self.run_id, params=params[i:i + batch])

    def log(self, step: int, row: dict) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(key, value, now, step) for key, value in scalars(row).items()]
        if metrics:
            self.client.log_batch(self.run_id, metrics=metrics)

    def finish(self, summary: dict | None, status: str | None = None) -> None:
        if self.client is None:
            return
        client, self.client = self.client, None
        status = status or ("FINISHED" if summary is not None else "FAILED")
        try:
            if summary is not None:
                from mlflow.entities import Metric

                now, step = int(time.time() * 1000), int(summary.get("steps") or 0)
                final = [Metric(k, v, now, step) for k, v in final_metrics(summary).items()]
                if final:
                    client.log_batch(self.run_id, metrics=final)
        finally:
            client.set_terminated(self.run_id, status=status)


def _mlflow_limits() -> tuple[int, int, int]:
    """MLflow's longest param value, longest key and params per batch (its own constants where it has them)."""
    try:
        from mlflow.utils import validation

        return (validation.MAX_PARAM_VAL_LENGTH, validation.MAX_ENTITY_KEY_LENGTH,
                validation.MAX_PARAMS_TAGS_PER_BATCH)
    except (ImportError, AttributeError):  # pragma: no cover - older or newer MLflow
        return 6000, 250, 100


__all__ = ["LOGGERS", "Logger", "MLflowLogger", "TensorBoardLogger", "WandbLogger", "make_loggers"]
