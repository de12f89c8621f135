"""The steps of a run, nanoGPT-style: run a step, then evaluate, call back, record, checkpoint and stop,
each when due. The step itself (ES: ask, evaluate, tell, update, optimizer step; backprop: forward,
backward, optimizer step) is the step object's (:mod:`nesgpu.train.steps.evolution`,
:mod:`nesgpu.train.steps.backprop`).
"""

from __future__ import annotations

import json
import math
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..layers.scales import MAX_SCALE
from ..tasks.protocol import DescribesFitness, Fingerprinted, KeepsSamples, LogsMetrics, ReportsEvaluation
from .setup.config import TrainConfig
from .steps.evolution import Stepper
from .steps.signal import SignalWatch
from .storage.checkpoint import WEIGHTS, save_checkpoint
from .storage.samples import keep_samples_to


class Interrupted(Exception):
    """The run was stopped (Ctrl-C, SIGTERM) at a step boundary, after writing a checkpoint."""

    def __init__(self, out: Path, step: int, message: str | None = None):
        super().__init__(message or f"interrupted: checkpoint at step {step} in {out}; continue with --resume {out}")
        self.out, self.step = out, step


@dataclass
class Progress:
    """What a run has done so far (and a checkpoint restores)."""

    elapsed: float = 0.0
    env_steps: int = 0
    last_checkpoint: int | None = None
    last_eval: float = 0.0
    stopped: str | None = None  # what ended the run at its last checkpoint (None: it had not ended there)
    stopped_value: float | None = None  # the evaluation that reached the target, if the target ended it


@dataclass
class Loop:
    """One run's steps and what follows each; rank 0 (``main``) evaluates, records and writes."""

    cfg: TrainConfig
    out: Path
    task: object
    stepper: Stepper
    main: bool
    distributed: bool
    metrics: object = None  # MetricsLog on rank 0
    log: object = print
    callback: object = None
    stop_requested: object = lambda: False
    progress: Progress = field(default_factory=Progress)
    compiled: bool = False  # whether the task's rollouts (or decode) run compiled: the first step compiles them
    target: float | None = None
    stopped: str = "steps"  # why the run ended: steps, target, callback or time_budget (summary.json)

    def __post_init__(self):
        cfg = self.cfg
        self.eval_every = cfg.eval_every or max(1, cfg.steps // 10)
        # a budgeted run's steps are not known ahead: it evaluates every tenth of its budget, unless told otherwise
        budgeted = cfg.time_budget is not None and not cfg.eval_every and not self.stepper.needs_sync
        self.eval_seconds = cfg.eval_seconds or (cfg.time_budget / 10 if budgeted else 0.0)
        self.checkpoint_every = cfg.checkpoint_every or max(1, cfg.steps // 10)
        self.target = cfg.target if cfg.target is not None else self.task.default_target
        if self.target is not None and self.distributed:  # only rank 0 evaluates: the ranks could not stop together
            self.log(f"the target {self.target} is not used under torchrun: the run goes to --steps {cfg.steps}")
            self.target = None
        if cfg.time_budget is not None and self.distributed:
            raise ValueError("time_budget cannot stop a torchrun job (the ranks would not stop together); use --steps")
        scheduled = [name for name in ("sigma", "lr")  # rsqrt does not depend on --steps
                     if (getattr(cfg, f"{name}_schedule") or "constant") not in ("constant", "rsqrt")]
        if cfg.time_budget is not None and scheduled and self.main:
            warnings.warn(f"the {' and '.join(scheduled)} schedule runs over --steps ({cfg.steps}), not over "
                          f"--time-budget: a run the budget stops first ends part-way through it; set --steps to "
                          f"about the steps the budget reaches", stacklevel=2)
        if self.main:
            keep_samples_to(self.out / "samples.jsonl", self.stepper.step, self.log)  # as metrics rows
        # the task's optional protocols, checked once (a runtime Protocol's isinstance costs ~10 us a step)
        self.logs_metrics = isinstance(self.task, LogsMetrics)
        self.reports = isinstance(self.task, ReportsEvaluation)
        self.shown = (*shown_statistics(self.task, self.stepper.progress_key), self.task.metric)
        self.watch = SignalWatch(self.log, self.metrics.rows if self.metrics is not None else ())
        if cfg.eval_seconds and self.stepper.needs_sync:
            raise ValueError("eval_seconds cannot time the evaluations of a sharded job (every rank gathers the "
                             "weights at the same step); use --eval-every")

    def run(self) -> None:
        """Steps until ``cfg.steps``, a target, the time budget, the callback or a stop request."""
        bar = _progress_bar(self.cfg.steps, self.stepper.step) if self.main else None
        start, last_line = time.perf_counter() - self.progress.elapsed, -math.inf  # the first step's line at once
        self._origin = (self.stepper.step, self.progress.elapsed)  # where this run's ETA counts from
        self._compiling = self.compiled and self.stepper.step < self.cfg.steps  # this process's first step compiles
        if self.main and self._compiling:
            self.log("compiling (torch.compile) in the first step: it takes longer, and the ETA leaves it out")
        if self.main and (bar is None or bar.disable) and self.cfg.progress_every:  # a line before the first step
            self.log(f"step {self.stepper.step}/{self.cfg.steps}  {self.progress.elapsed:.0f} s  starting")
        try:
            if self._met_already():
                return
            self.progress.stopped = self.progress.stopped_value = None  # it goes on: it has not ended yet
            self._logged("")  # what the task's reward functions logged before this run (a tuning trial's) is not its
            self._evaluate_start()
            while self.stepper.step < self.cfg.steps:
                stats = self.stepper.run()  # the step's one read from the device
                step = self.stepper.step
                self.progress.env_steps += int(stats.pop("env_steps", 0))
                self.progress.elapsed = time.perf_counter() - start
                if self._compiling:  # the ETA's rate counts from the step after it
                    self._origin, self._compiling = (step, self.progress.elapsed), False
                if self.stepper.needs_sync and (self._eval_due(step) or self._checkpoint_due(step)):
                    self.stepper.sync()  # every rank: rank 0's plain model and optimizer state, for what follows
                logged = self._logged("log_metric/")  # every rank takes its own, so that none piles up
                if not self.main:
                    continue
                row = named({"step": step, "seconds": self.progress.elapsed, "env_steps": self.progress.env_steps,
                             **stats, **logged}, self.task)
                self.watch.see(step, row, getattr(self.stepper, "probe", None))  # an ES step's probe, if it ran
                stop = self._after_step(step, row)
                last_line = self._show(bar, row, last_line)
                if stop or step == self.cfg.steps:
                    self.progress.stopped = self.stopped
                if self._checkpoint_due(step) or stop:
                    self.checkpoint(step)
                if stop:
                    self.log(stop)
                    break
                if self.stop_requested() and step < self.cfg.steps:
                    if self.progress.last_checkpoint != step:
                        self.checkpoint(step)
                    raise Interrupted(self.out, step)
        finally:
            if bar is not None:
                bar.close()

    def _met_already(self) -> bool:
        """A resumed run that ended at its checkpoint and still meets its stop condition takes no step: resume
        trains further only when the option that stopped the run now lets it (a larger --steps, --time-budget,
        or a target the run has not reached). A run stopped by its callback is asked again after a step."""
        progress, step = self.progress, self.stepper.step
        if step >= self.cfg.steps:
            why, option = f"it made its {self.cfg.steps} steps", "--steps"
        elif progress.stopped == "time_budget" and self._out_of_time():
            why = f"its time budget of {self.cfg.time_budget:g} s is spent ({progress.elapsed:.1f} s)"
            option = "--time-budget"
        elif progress.stopped == "target" and self.target is not None and progress.stopped_value >= self.target:
            why = f"its {self.task.metric} {progress.stopped_value:.4g} reached the target {self.target:.4g}"
            option = "--target"
        else:
            return False
        self.stopped = progress.stopped or "steps"
        self.log(f"the run ended at step {step}: {why}; no step is taken (raise {option} to train further)")
        return True

    def _evaluate_start(self) -> None:
        """A new run's first point: the metric of the model before any step (and its samples), as step 0. A
        sharded job has none: gathering its state before the first step would initialise the optimizer's."""
        if self.stepper.step != 0 or self.stepper.needs_sync:
            return
        check_start_finite(self.stepper.model)  # every rank: they stop together
        if self.main:
            metric = evaluated(self.task, self.stepper.model)
            self._write_samples(0)
            self.metrics.write(named({"step": 0, "seconds": 0.0, "env_steps": 0, self.task.metric: metric,
                                      **self._evaluation_info(), **self._logged("eval_log_metric/")}, self.task))

    def _logged(self, prefix: str) -> dict[str, float]:
        """What the task's reward functions logged since the last take (TRL's log_metric), keys prefixed."""
        if not self.logs_metrics:
            return {}
        return {prefix + name: value for name, value in self.task.logged_metrics().items()}

    def _evaluation_info(self) -> dict[str, float]:
        """What the task's evaluation measured beside its metric (a language model's eval_ columns and drift)."""
        return self.task.evaluation_info() if self.reports else {}

    def _out_of_time(self) -> bool:
        return self.cfg.time_budget is not None and self.progress.elapsed >= self.cfg.time_budget

    def _eval_due(self, step: int) -> bool:
        seconds = self.eval_seconds and self.progress.elapsed - self.progress.last_eval >= self.eval_seconds
        return step % self.eval_every == 0 or step == self.cfg.steps or self._out_of_time() or bool(seconds)

    def _checkpoint_due(self, step: int) -> bool:
        return step % self.checkpoint_every == 0 or step == self.cfg.steps

    def _after_step(self, step: int, row: dict) -> str | None:
        """Evaluate when due, call the callback, write the row; why the run ends at this step, if it does."""
        stop = None
        if self._eval_due(step):
            metric = self.task.metric
            row[metric] = evaluated(self.task, self.stepper.model)
            row.update(self._evaluation_info())
            row.update(self._logged("eval_log_metric/"))
            self.progress.last_eval = self.progress.elapsed
            self._write_samples(step)
            if self.target is not None and row[metric] >= self.target:
                self.stopped, self.progress.stopped_value = "target", row[metric]
                stop = f"{metric} {row[metric]:.4g} reached the target {self.target:.4g} at step {step}"
        if self.callback is not None and bool(self.callback(step, dict(row))):
            if self.distributed:
                raise ValueError("a callback cannot stop a torchrun job: the ranks would not stop together")
            if stop is None:
                stop, self.stopped = f"the callback stopped the run at step {step}", "callback"
        if self._out_of_time() and step < self.cfg.steps and stop is None:
            stop, self.stopped = f"the time budget of {self.cfg.time_budget:g} s ran out at step {step}", "time_budget"
        self.metrics.write(row)
        return stop

    def _write_samples(self, step: int) -> None:
        """A task's kept samples of this evaluation (a language model's prompts, completions and rewards),
        one JSON line each with the step, appended to ``samples.jsonl``."""
        if not isinstance(self.task, KeepsSamples):
            return
        with open(self.out / "samples.jsonl", "a") as f:
            for sample in self.task.samples:
                f.write(json.dumps({"step": step, **sample}) + "\n")

    def _show(self, bar, row: dict, last_line: float) -> float:
        """The progress bar on a terminal; else a plain line every ``progress_every`` seconds."""
        shown = self.shown
        if bar is not None and not bar.disable:
            bar.update(1)
            bar.set_postfix({k: f"{row[k]:.4g}" for k in shown if k in row})
        elif self.cfg.progress_every and time.perf_counter() - last_line >= self.cfg.progress_every:
            eta = self._eta(row)
            self.log(f"step {row['step']}/{self.cfg.steps}  {self.progress.elapsed:.0f} s  "
                     + ("compiled, no ETA yet  " if eta is None else f"ETA {eta:.0f} s  ")
                     + "  ".join(f"{k} {row[k]:.4g}" for k in shown if k in row))
            return time.perf_counter()
        return last_line

    def _eta(self, row: dict) -> float | None:
        """Seconds left to ``cfg.steps`` at this run's mean step time so far, compiling left out (None: the only
        step so far compiled)."""
        first, elapsed = self._origin
        if row["step"] <= first:
            return None if row["step"] < self.cfg.steps else 0.0
        return (self.progress.elapsed - elapsed) / (row["step"] - first) * max(0, self.cfg.steps - row["step"])

    def checkpoint(self, step: int) -> None:
        """Everything a resume needs, written atomically, once the weights are known to be finite."""
        check_finite(self.stepper, step, self.progress.last_checkpoint, self.out / "checkpoint")
        save_checkpoint(self.out / "checkpoint", self.stepper.model, {
            "strategy": self.stepper.state_dict(), "seconds": self.progress.elapsed,
            "env_steps": self.progress.env_steps, "config": self.cfg.to_dict(), "compiled": self.compiled,
            "stopped": [self.progress.stopped, self.progress.stopped_value],
            **({"data": self.task.data_fingerprint()} if isinstance(self.task, Fingerprinted) else {})})
        self.progress.last_checkpoint = step


def evaluated(task, model) -> float:
    """``task.evaluate(model)``, checked: a real number (the metric), else an error naming the task."""
    value = task.evaluate(model)
    if isinstance(value, torch.Tensor) and value.numel() == 1 and not value.is_complex():
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{type(task).__name__}.evaluate must return a number (its {task.metric!r}); got "
                        f"{type(value).__name__} {value!r:.40}")
    return float(value)


def named(row: dict, task) -> dict:
    """``row`` with the keys ``task`` names otherwise renamed (its ``column_names``: a language model's
    ``env_steps`` is TRL's ``num_tokens``, its ``lr`` TRL's ``learning_rate``)."""
    names = getattr(task, "column_names", None)
    return {names.get(k, k): v for k, v in row.items()} if names else row


def shown_statistics(task, progress_key: str) -> tuple[str, ...]:
    """The step statistics a user reads for ``task``: those it describes (a generation task's raw reward, never
    the shaped fitness), else the stepper's own (``progress_key``)."""
    return tuple(task.describes) if isinstance(task, DescribesFitness) else (progress_key,)


# a trained weight beyond this has left every scale a network works at (initialisations are ~1, trained
# weights rarely pass 100): a checkpoint holding one is not worth resuming with a smaller step size
SANE_WEIGHT = 1e6


def check_finite(stepper: Stepper, step: int, last_good: int | None, checkpoint: Path | None = None) -> None:
    """Refuse to save non-finite weights or optimizer state (one host read per checkpoint). The message says
    what to do: resume the last good checkpoint (``checkpoint``) with a smaller step size, or, when its weights
    have already grown out of all measure (an --lr far too large from the start), start a new run."""
    model = stepper.model
    tensors = [(n, p) for n, p in model.named_parameters()]
    tensors += [(n, b) for n, b in model.named_buffers() if b.is_floating_point()]  # observation statistics
    state = stepper.state_dict()
    tensors += [(f"optimizer state {k}", v) for st in state["optimizer"]["state"].values()
                for k, v in st.items() if isinstance(v, torch.Tensor) and v.is_floating_point()]
    bad = non_finite(tensors)
    scales = state.get("scales") or {}  # a sigma per parameter past MAX_SCALE: no resume would take it
    if scales and not bad:  # NaN fails "<=" too; one host read for every scale
        largest = torch.stack([v.amax().to(next(iter(scales.values())).device) for v in scales.values()]).tolist()
        bad = [f"scales[{n!r}] over {MAX_SCALE:g}" for n, m in zip(scales, largest) if not m <= MAX_SCALE]
    if not bad:
        return
    sizes = "--lr" if stepper.chunk is None else "--lr or --sigma"  # backprop has no sigma
    largest = _largest_weight(checkpoint, {n for n, _ in model.named_parameters()}) if last_good else None
    if not last_good:
        advice = f"no checkpoint was written; start again with a smaller {sizes}"
    elif largest is not None and largest > SANE_WEIGHT:
        advice = (f"the checkpoint of step {last_good} is kept, but its weights already reach {largest:.3g}, so "
                  f"a smaller step size cannot save it: start a new run with a smaller {sizes}")
    else:
        advice = f"the checkpoint of step {last_good} is kept; resume it with a smaller {sizes}"
    raise ValueError(f"step {step} made non-finite (or out of range) values in {bad[:4]}"
                     f"{' ...' if len(bad) > 4 else ''}; the run stops: {advice}")


def non_finite(tensors: list) -> list[str]:
    """The names among (name, tensor) pairs whose tensor holds NaN or infinity, in one host read."""
    if not tensors:
        return []
    finite = torch.stack([_finite(t).to(tensors[0][1].device) for _, t in tensors])
    if bool(finite.all()):  # the names only when something is wrong
        return []
    return [n for (n, _), ok in zip(tensors, finite.tolist()) if not ok]


def _finite(t: torch.Tensor) -> torch.Tensor:
    """Whether every entry of ``t`` is finite, as a tensor: its largest and smallest entries are (both reductions
    propagate NaN), read without a temporary the size of ``t`` (``isfinite(t)`` would hold a bool per entry)."""
    if not t.numel():
        return torch.ones((), dtype=torch.bool, device=t.device)
    return torch.stack([t.amax(), t.amin()]).isfinite().all()


def check_start_finite(model) -> None:
    """Refuse a model whose weights are NaN or infinite before any step (no step size is to blame then)."""
    bad = non_finite([(n, p) for n, p in model.named_parameters() if p.is_floating_point()])
    if not bad:
        return
    raise ValueError(f"the model's weights {bad[:4]}{' ...' if len(bad) > 4 else ''} hold NaN or infinity before "
                     f"the first step: the model passed in (or the checkpoint it was loaded from) is damaged")


def _largest_weight(checkpoint: Path | None, parameters: set[str]) -> float | None:
    """The largest |value| among a checkpoint's parameters (None: no checkpoint to read)."""
    if checkpoint is None or not (checkpoint / WEIGHTS).is_file():
        return None
    from safetensors import safe_open

    with safe_open(str(checkpoint / WEIGHTS), "pt") as f:
        values = [f.get_tensor(name).abs().max() for name in f.keys() if name in parameters]
    return float(torch.stack(values).max()) if values else None


def _progress_bar(total: int, initial: int):
    try:
        from tqdm import tqdm
    except ImportError:  # pragma: no cover - tqdm comes with the train extra
        return None
    return tqdm(total=total, initial=initial, disable=not sys.stderr.isatty(), unit="step", dynamic_ncols=True)


__all__ = ["Interrupted", "Loop", "Progress", "check_finite", "evaluated", "shown_statistics"]
