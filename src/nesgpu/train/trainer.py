"""The training loop: ask, evaluate the population, tell; record, checkpoint, resume."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import gc
import json
import math
import os
import signal
import sys
import threading
import time
import warnings
from pathlib import Path
from typing import NamedTuple

import torch

from .. import __version__
from ..conversion import convert
from ..model import PerturbedModel
from ..strategies import STRATEGIES, Schedule, Strategy
from ..tasks import SUPERVISED, make_task
from ..tasks.protocol import check_differentiable, check_task
from . import rundir
from .activations import checkpoint_blocks
from .backprop import Backprop, BackpropStep, shard_model
from .checkpoint import find_checkpoint, load_checkpoint, load_weights, save_checkpoint, save_weights, write_json
from .config import BACKPROP, TrainConfig, compiles
from .distributed import Ranks, init_from_environment, shutdown
from .initialization import init_weights
from .loggers import make_loggers
from .metrics import MetricsLog, plot_curve
from .population import PopulationStep


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError as e:
        raise ValueError(f"device must be auto, cpu, cuda or cuda:N; got {name!r}") from e
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name!r} requested, but CUDA is not available")
    return device


def make_strategy(cfg: TrainConfig, pm: PerturbedModel) -> Strategy:
    """The config's strategy from the registry, with the options it takes (``Strategy.config_options``)."""
    cls = STRATEGIES[cfg.strategy]
    schedules = dict(
        sigma_schedule=None if cfg.sigma_schedule == "constant" else Schedule(cfg.sigma_schedule, cfg.sigma_final,
                                                                              cfg.steps),
        lr_schedule=None if cfg.lr_schedule == "constant" else Schedule(cfg.lr_schedule, cfg.lr_final, cfg.steps))
    return cls(pm, lr=cfg.lr, **schedules, **strategy_options(cfg))


def strategy_options(cfg: TrainConfig) -> dict:
    """The config's values of the options its strategy takes, by the strategy's argument names."""
    return {arg: getattr(cfg, name) for name, arg in STRATEGIES[cfg.strategy].config_options.items()}


def make_backprop(cfg: TrainConfig, task, model: torch.nn.Module, ranks: Ranks | None = None) -> Backprop:
    """The optimizer side of a backprop run: activation checkpointing when asked, DistributedDataParallel
    under torchrun, the config's optimizer and lr schedule."""
    distributed = ranks is not None and ranks.distributed
    if cfg.shard and not distributed:
        warnings.warn("--shard applies to torchrun jobs of several processes; this one process trains the whole "
                      "model", stacklevel=2)
    sharded = cfg.shard and distributed
    plain = copy.deepcopy(model) if sharded else None  # unsharded: what rank 0 evaluates and saves
    if cfg.activation_checkpointing:
        checkpoint_blocks(model)
    module = model
    if sharded:
        module = shard_model(model)
    elif distributed:
        from torch.nn.parallel import DistributedDataParallel

        module = DistributedDataParallel(model, device_ids=[model_device(model)] if task.device.type == "cuda"
                                         else None)
    schedule = None if cfg.lr_schedule == "constant" else Schedule(cfg.lr_schedule, cfg.lr_final, cfg.steps)
    return Backprop(model, cfg.optimizer, lr=cfg.lr, weight_decay=cfg.weight_decay, lr_schedule=schedule,
                    module=module, plain=plain)


def model_device(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


def build(cfg: TrainConfig, device: torch.device, ranks: Ranks | None = None):
    """Task, model, PerturbedModel and strategy of a resolved config.

    An ES run's model is converted to the perturbed kind. A backprop run's stays plain, its PerturbedModel is
    None and its strategy a :class:`~nesgpu.train.backprop.Backprop`, which under torchrun (``ranks``)
    calls the model through DistributedDataParallel."""
    backprop = cfg.strategy == BACKPROP
    normalize = backprop or STRATEGIES[cfg.strategy].uses_observation_statistics(**strategy_options(cfg))
    task = check_task(make_task(cfg.task, device=device, seed=cfg.seed, batch_size=cfg.batch_size,
                                episodes=cfg.episodes, eval_episodes=cfg.eval_episodes, vector_mode=cfg.vector_mode,
                                normalize_observations=normalize, compile=compiles(cfg),
                                reward_shift=cfg.reward_shift, start_states=cfg.start_states,
                                policy_output="tanh" if cfg.policy_output == "auto" else cfg.policy_output,
                                observation_clip=cfg.observation_clip or None))
    with torch.random.fork_rng(devices=[]):  # seeded initialisation that leaves the caller's RNG alone
        torch.manual_seed(cfg.seed)
        model = init_weights(task.make_model(cfg.hidden, model=cfg.model), cfg.init)
    if backprop:
        bp = make_backprop(cfg, check_differentiable(task), model.to(device), ranks)
        return task, bp.plain, None, bp
    model = convert(model, cfg.layer, bits=cfg.bits, noise_on=cfg.noise_on, act_bits=cfg.act_bits,
                    **cfg.layer_options).to(device)
    pm = PerturbedModel(model, cfg.directions, sigma=cfg.sigma, antithetic=cfg.antithetic, seed=cfg.seed)
    return task, model, pm, make_strategy(cfg, pm)


def _progress(total: int, initial: int):
    try:
        from tqdm import tqdm
    except ImportError:  # pragma: no cover - tqdm comes with the train extra
        return None
    return tqdm(total=total, initial=initial, disable=not sys.stderr.isatty(), unit="step", dynamic_ncols=True)


class Interrupted(Exception):
    """The run was stopped (Ctrl-C, SIGTERM) at a step boundary, after writing a checkpoint."""

    def __init__(self, out: Path, step: int):
        super().__init__(f"interrupted: checkpoint at step {step} in {out}; continue with --resume {out}")
        self.out, self.step = out, step


@contextlib.contextmanager
def _stop_requests(enabled: bool):
    """Yields a function telling whether SIGINT / SIGTERM asked the run to stop. The first signal asks to
    stop at the end of the current step (with a checkpoint); a second one stops at once."""
    requested: list[int] = []
    if not enabled or threading.current_thread() is not threading.main_thread():
        yield lambda: False
        return

    def handler(signum, frame):
        if requested:
            raise KeyboardInterrupt
        requested.append(signum)

    saved = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield lambda: bool(requested)
    finally:
        for sig, previous in saved.items():
            signal.signal(sig, previous)


def _log_to_stderr(*args, **kwargs) -> None:
    print(*args, file=sys.stderr, **kwargs)  # stdout carries the summary JSON only


def train(cfg: TrainConfig, resume: bool = False, log=_log_to_stderr, overwrite: bool = False,
          callback=None) -> dict:
    """Run (or resume) a training run; returns the summary written to ``summary.json``.

    A new run refuses an existing run directory unless ``overwrite``; a lock file keeps a second process
    out of a live run. Ctrl-C (or SIGTERM) stops at the end of the current step with a checkpoint and
    raises :class:`Interrupted`. ``callback(step, row)``, if given, runs on rank 0 after every step with that
    step's metrics (the row of metrics.csv; the task's metric on evaluation steps); returning True stops the
    run there, with a checkpoint, as a finished run (an exception it raises, e.g. Optuna's TrialPruned,
    propagates). Progress and notes go to ``log`` (standard error by default). Under torchrun (WORLD_SIZE > 1) every process runs this; ranks split the
    directions, exchange fitness, and compute the same update. Only rank 0 writes files.
    """
    cfg = cfg.resolved()
    if cfg.out is None:  # the default: a new directory per run, never an old run's
        cfg.out = str(rundir.fresh_directory(Path("runs"), cfg.task.replace(":", "-").replace("/", "-")))
    out = Path(cfg.out)
    device = resolve_device(cfg.device)
    if device.type == "cuda" and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    ranks = init_from_environment(device, cfg.dist_timeout)
    try:
        lock = rundir.RunLock(out) if ranks.is_main else contextlib.nullcontext()
        # distributed ranks stop together through the collective timeout, not at a signal of their own
        with lock, _stop_requests(enabled=not ranks.distributed) as stop_requested:
            if ranks.is_main:
                rundir.check(out, resume, overwrite)
            summary = _train(cfg, out, device, ranks, resume, log if ranks.is_main else (lambda *a, **k: None),
                             stop_requested, callback, overwrite)
        ranks.barrier()  # tear the group down together, once rank 0 has written its files
        return summary
    finally:  # after an error, without the barrier: a dead peer would make it wait for the timeout
        if ranks.distributed:  # free the run's modules (FSDP's hold the process group in reference cycles)
            gc.collect()  # before the group goes: freed after it, gloo could abort the process at exit
        shutdown()


def _scheduled_values(old: dict, cfg: TrainConfig, strategy: Strategy) -> list[tuple[str, float, float]]:
    """(name, value under the checkpoint's schedule, value under the new one) of sigma's and lr's factor at
    the next step, for schedules that are not constant in either run."""
    step, values = strategy.step, []
    for name in ("lr", "sigma"):
        kinds = (old.get(f"{name}_schedule") or "constant", getattr(cfg, f"{name}_schedule"))
        if kinds == ("constant", "constant"):
            continue
        final = old.get(f"{name}_final")
        before = Schedule(kinds[0], 1.0 if final is None else final, max(1, int(old.get("steps") or 1)))(step)
        after = Schedule(kinds[1], getattr(cfg, f"{name}_final"), cfg.steps)(step)
        values.append((f"{name} factor", before, after))
    return values


def _check_finite(model, strategy, step: int, last_good: int | None) -> None:
    """Refuse to save non-finite weights or optimizer state (one host read per checkpoint)."""
    tensors = [(n, p) for n, p in model.named_parameters()]
    tensors += [(n, b) for n, b in model.named_buffers() if b.is_floating_point()]  # observation statistics
    tensors += [(f"optimizer state {k}", v) for st in strategy.state_dict()["optimizer"]["state"].values()
                for k, v in st.items() if isinstance(v, torch.Tensor) and v.is_floating_point()]
    finite = torch.stack([torch.isfinite(t).all().to(tensors[0][1].device) for _, t in tensors])
    if bool(finite.all()):  # one host read; the names only when something is wrong
        return
    bad = [n for (n, _), ok in zip(tensors, finite.tolist()) if not ok]
    kept = f"the checkpoint of step {last_good} is kept" if last_good else "no checkpoint was written"
    raise ValueError(f"step {step} made non-finite values in {bad[:4]}{' ...' if len(bad) > 4 else ''}; the run "
                     f"stops and {kept}; resume with a smaller --lr or --sigma")


def _train(cfg: TrainConfig, out: Path, device: torch.device, ranks: Ranks, resume: bool, log,
           stop_requested=lambda: False, callback=None, overwrite: bool = False) -> dict:
    main = ranks.is_main
    task, model, pm, strategy = build(cfg, device, ranks)
    loggers = make_loggers(None if cfg.log is None else cfg.log.split(","), out) if main else []
    if main:  # only now that the new run is built: a mistyped option must not cost the old run
        rundir.clear(out, overwrite and not resume)
    elapsed, env_steps, last_checkpoint = 0.0, 0, None
    if resume:
        new = dataclasses.asdict(cfg)

        def check(state):
            old = state.get("config", {}) if isinstance(state, dict) else {}
            old = {**rundir.legacy(cfg.task in SUPERVISED), **old}  # what an older nesgpu's run did
            if old.get("task") != cfg.task:
                raise ValueError(f"checkpoint in {out} is for task {old.get('task')!r}, not {cfg.task!r}")
            changed = rundir.differences(old, new, rundir.DEFINING)
            if changed:
                raise ValueError(f"cannot resume {out}: options that define the run differ from its checkpoint "
                                 f"({'; '.join(changed)}); start a new run to change them")
            at = int(state.get("strategy", {}).get("step", 0))
            if cfg.steps < at:
                raise ValueError(f"--steps {cfg.steps} is below the checkpoint's step {at}; expected >= {at}")
        state = load_checkpoint(out / "checkpoint", model, validate=check)
        try:
            strategy.load_state_dict(state["strategy"])
        except (KeyError, ValueError, RuntimeError) as e:
            raise ValueError(f"checkpoint in {out} does not match this configuration: {e}") from e
        elapsed, env_steps = float(state["seconds"]), int(state["env_steps"])
        last_checkpoint = strategy.step
        old = state["config"]
        if pm is not None and old.get("sigma") != cfg.sigma:  # an explicit new sigma replaces the run's current one
            pm.sigma = strategy.sigma0 = cfg.sigma
        if old.get("lr") != cfg.lr:
            strategy.set_lr(cfg.lr)
        # a new schedule (or a new --steps, which stretches one) applies from the next step: say where it jumps
        jumps = [f"{name} {before:.4g} -> {after:.4g}" for name, before, after in _scheduled_values(old, cfg, strategy)
                 if not math.isclose(before, after, rel_tol=1e-9)]
        changed = rundir.differences(old, new, [n for n in new if n not in rundir.DEFINING and n != "out"])
        log(f"resuming {out} at step {strategy.step} of {cfg.steps}"
            + (f"; from step {strategy.step + 1}: {'; '.join(changed)}" if changed else "")
            + (f" (at that step {', '.join(jumps)})" if jumps else ""))
    population = (BackpropStep(task, strategy, ranks, cfg.precision, cfg.accumulate) if pm is None
                  else PopulationStep(task, pm, strategy, ranks, cfg.chunk_size, cfg.precision, log))
    if main:
        write_json(out / "config.json", json.loads(cfg.to_json()))
    metrics = MetricsLog(out, resume_step=strategy.step if resume else 0, loggers=loggers,
                         config=dataclasses.asdict(cfg)) if main else None
    try:
        eval_every = cfg.eval_every or max(1, cfg.steps // 10)
        target = cfg.target if cfg.target is not None else task.default_target
        if target is not None and ranks.distributed:  # only rank 0 evaluates: the ranks could not stop together
            log(f"the target {target} is not used under torchrun: the run goes to --steps {cfg.steps}")
            target = None
        if cfg.time_budget is not None and ranks.distributed:
            raise ValueError("time_budget cannot stop a torchrun job (the ranks would not stop together); use --steps")
        if cfg.eval_seconds and getattr(strategy, "sharded", False):
            raise ValueError("eval_seconds cannot time the evaluations of a sharded job (every rank gathers the "
                             "weights at the same step); use --eval-every")
        checkpoint_every = cfg.checkpoint_every or max(1, cfg.steps // 10)

        def checkpoint(step):
            nonlocal last_checkpoint
            _check_finite(model, strategy, step, last_checkpoint)
            save_checkpoint(out / "checkpoint", model, {
                "strategy": strategy.state_dict(), "seconds": elapsed, "env_steps": env_steps,
                "config": dataclasses.asdict(cfg)})
            last_checkpoint = step

        bar = _progress(cfg.steps, strategy.step) if main else None
        shown = ("fitness_mean" if pm is not None else "train_loss", task.metric)  # in the progress line
        last_line = time.perf_counter()
        start = time.perf_counter() - elapsed
        last_eval = elapsed
        try:
            while strategy.step < cfg.steps:
                step = strategy.step + 1
                stats = population.run()  # the step's one read from the device
                env_steps += int(stats.pop("env_steps", 0))
                elapsed = time.perf_counter() - start
                if getattr(strategy, "sharded", False) and (step % eval_every == 0 or step % checkpoint_every == 0
                                                            or step == cfg.steps):
                    strategy.sync()  # every rank: rank 0's plain model and optimizer state, for what follows
                if not main:
                    continue
                row = {"step": step, "seconds": elapsed, "env_steps": env_steps, **stats}
                stop = None  # why the run ends at this step, if it does
                out_of_time = cfg.time_budget is not None and elapsed >= cfg.time_budget
                if (step % eval_every == 0 or step == cfg.steps or out_of_time
                        or (cfg.eval_seconds and elapsed - last_eval >= cfg.eval_seconds)):
                    row[task.metric] = task.evaluate(model)
                    last_eval = elapsed
                    if target is not None and row[task.metric] >= target:
                        stop = f"{task.metric} {row[task.metric]:.4g} reached the target {target:.4g} at step {step}"
                if callback is not None and bool(callback(step, dict(row))):
                    if ranks.distributed:
                        raise ValueError("a callback cannot stop a torchrun job: the ranks would not stop together")
                    stop = stop or f"the callback stopped the run at step {step}"
                if out_of_time and step < cfg.steps:
                    stop = stop or f"the time budget of {cfg.time_budget:g} s ran out at step {step}"
                metrics.write(row)
                if bar is not None and not bar.disable:
                    bar.update(1)
                    bar.set_postfix({k: f"{row[k]:.4g}" for k in shown if k in row})
                elif cfg.progress_every and time.perf_counter() - last_line >= cfg.progress_every:
                    last_line = time.perf_counter()  # no terminal (a log file, a job queue): a plain line now and then
                    log(f"step {step}/{cfg.steps}  {elapsed:.0f} s  " + "  ".join(
                        f"{k} {row[k]:.4g}" for k in shown if k in row))
                if step % checkpoint_every == 0 or step == cfg.steps or stop:
                    checkpoint(step)
                if stop:
                    log(stop)
                    break
                if stop_requested() and step < cfg.steps:
                    if last_checkpoint != step:
                        checkpoint(step)
                    raise Interrupted(out, step)
        finally:
            if bar is not None:
                bar.close()
        if pm is not None:
            pm.free_memory()
        es = pm is not None  # a backprop run has no population, noise or layer kind
        summary = {"task": cfg.task, "metric": task.metric, "value": None, "steps": strategy.step,
                   "seconds": round(elapsed, 3), "env_steps": env_steps, "strategy": cfg.strategy,
                   "layer": cfg.layer if es else None, "population": cfg.population if es else None,
                   "sigma": pm.sigma if es else None, "lr": cfg.lr, "seed": cfg.seed,
                   "device": str(device), "processes": ranks.world, "chunk_size": population.chunk,
                   "precision": cfg.precision}
        if cfg.bits is not None:
            summary.update(bits=cfg.bits, noise_on=cfg.noise_on, act_bits=cfg.act_bits)
        if not main:
            return summary
        summary["value"] = task.evaluate(model)
        summary["versions"] = {"nesgpu": __version__, "torch": torch.__version__}
        _check_finite(model, strategy, cfg.steps, last_checkpoint)
        save_weights(model, out / "model.safetensors", metadata={"nesgpu_config": cfg.to_json(),
                                                                  "nesgpu_version": __version__})
        plot_curve(metrics.rows, task.metric, out / "curve.png", f"{cfg.task}: {cfg.strategy}, {cfg.layer}")
        write_json(out / "summary.json", summary)
        log(f"{cfg.task}: {task.metric} = {summary['value']:.4f} after {strategy.step} steps in {elapsed:.1f} s "
            f"-> {out}")
    except BaseException as e:  # the trackers' runs end as killed (Ctrl-C) or failed
        if metrics is not None:
            metrics.close(status="KILLED" if isinstance(e, (Interrupted, KeyboardInterrupt)) else "FAILED")
        raise
    metrics.close(summary)
    return summary


class Run(NamedTuple):
    """A finished run, loaded: the trained plain model, its task and its resolved configuration."""

    model: torch.nn.Module
    task: object
    config: TrainConfig


def load_run(directory: str | Path, device: str = "auto") -> Run:
    """The trained model of a run directory (``config.json`` + ``model.safetensors``; for a run that has not
    finished, its last checkpoint, with a warning), with its task and config, in one call. Weights that are
    not finite are refused.

    Example:
        >>> model, task, config = nesgpu.load_run("runs/digits")
        >>> task.evaluate(model)
    """
    directory = Path(directory)
    config_path = directory / "config.json"
    if not config_path.is_file():
        raise ValueError(f"{directory} is not a run directory (no config.json)")
    try:
        values = json.loads(config_path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{config_path} is not valid JSON ({e})") from e
    cfg = TrainConfig.from_dict({**rundir.legacy(values.get("task") in SUPERVISED), **values},
                                source=str(config_path)).resolved()
    cfg.device = device
    task, model, _, _ = build(cfg, resolve_device(device))
    if (directory / "model.safetensors").is_file():
        load_weights(model, directory / "model.safetensors")
    elif find_checkpoint(directory / "checkpoint") is not None:  # an interrupted or crashed run
        step = int(load_checkpoint(directory / "checkpoint", model).get("strategy", {}).get("step", 0))
        warnings.warn(f"{directory} has not finished (no model.safetensors): using its last checkpoint, step {step}; "
                      f"continue it with nesgpu train --resume {directory}", stacklevel=2)
    else:
        raise ValueError(f"{directory} holds no weights yet (no model.safetensors, no checkpoint): the run stopped "
                         f"before its first checkpoint")
    bad = [n for n, t in model.state_dict().items() if t.is_floating_point() and not bool(torch.isfinite(t).all())]
    if bad:
        raise ValueError(f"{directory / 'model.safetensors'} holds non-finite values in {bad[:4]}; the run diverged")
    model.eval()
    return Run(model, task, cfg)


def evaluate_run(directory: str | Path, device: str = "auto") -> dict:
    """Rebuild a run's model from ``config.json`` and ``model.safetensors`` and evaluate it."""
    run = load_run(directory, device)
    return {"task": run.config.task, "metric": run.task.metric, "value": run.task.evaluate(run.model),
            "run": str(directory)}


__all__ = ["Interrupted", "Run", "TrainConfig", "build", "evaluate_run", "load_run", "resolve_device", "train"]
